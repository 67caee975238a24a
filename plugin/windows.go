// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"strings"
	"time"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// window is one window of a budget, as its status names it (status.summary.windows),
// with what it takes to come back: a rolling window refills continuously over its
// burst (its period by default), a calendar window starts again at its next anchor.
type window struct {
	// text is the window in words, as status.summary.windows writes it.
	text string
	// refill is the time a rolling window takes to refill from empty; 0 for a calendar.
	refill time.Duration
	// calendar is a calendar window's anchor; nil for a rolling one.
	calendar *config.Calendar
}

// windowsOf are a budget's windows in the order of status.summary.windows: its
// windows, or the ones its shorthand fields stand for (minute, day, request rate).
func windowsOf(b *twv1alpha1.TokenBudget) []window {
	s := &b.Spec
	texts := strings.Split(b.Status.Summary.Windows, ", ")
	var out []window
	add := func(w window) {
		if i := len(out); i < len(texts) {
			w.text = texts[i]
		}
		out = append(out, w)
	}
	if len(s.Windows) > 0 {
		for _, w := range s.Windows {
			add(specWindow(w))
		}
		return out
	}
	if s.TokensPerMinute > 0 {
		add(window{refill: time.Minute})
	}
	if s.TokensPerDay > 0 {
		add(window{refill: 24 * time.Hour})
	}
	if s.RequestsPerSecond > 0 {
		w := window{refill: time.Second}
		if s.BurstCapacity > 0 {
			w.refill = time.Duration(float64(time.Second) * float64(s.BurstCapacity) / float64(s.RequestsPerSecond))
		}
		add(w)
	}
	return out
}

// specWindow is one of a budget's windows.
func specWindow(w twv1alpha1.BudgetWindow) window {
	if r := w.Rolling; r != nil {
		d := config.Period(strings.ToLower(string(r.Period))).Duration()
		if r.BurstSeconds > 0 {
			d = time.Duration(r.BurstSeconds) * time.Second
		}
		return window{refill: d}
	}
	c := w.Calendar
	if c == nil {
		return window{}
	}
	return window{calendar: &config.Calendar{
		Every: config.CalendarUnit(strings.ToLower(string(c.Every))), TimeZone: c.TimeZone, At: c.At,
		Weekday: strings.ToLower(string(c.Weekday)), DayOfMonth: int(c.DayOfMonth),
	}}
}

// byText is the budget's window whose words are text; false when none is.
func byText(ws []window, text string) (window, bool) {
	for _, w := range ws {
		if w.text == text {
			return w, true
		}
	}
	return window{}, false
}

// back is when a window that uses usedPercent of its allowance comes back, with no
// more use: a rolling window refilled in full (usedPercent of its refill time, so a
// bucket in debt takes longer than one refill), a calendar window at its next start.
// refill is 0 for a calendar window, resets the zero time for a rolling one.
func (w window) back(usedPercent int32, now time.Time) (refill time.Duration, resets time.Time) {
	if w.calendar != nil {
		_, end := w.calendar.Span(now)
		return 0, end
	}
	if usedPercent <= 0 {
		return 0, time.Time{}
	}
	return time.Duration(float64(w.refill) * float64(usedPercent) / 100).Round(time.Second), time.Time{}
}
