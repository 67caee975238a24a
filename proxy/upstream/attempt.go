// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package upstream

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
)

// ErrFailover makes the reverse proxy drop an upstream's failed answer unwritten, so
// that the next upstream may serve the request.
var ErrFailover = errors.New("failing over to the model's next upstream")

// Pick is the one choice of a candidate: the first from i on that speaks the family f
// and may take a request at now (its credential not cooling, its breaker closed or
// letting a probe through), or -1 with the earliest time one may. take says an attempt
// is made: a half-open breaker's probe is taken, and more reports whether a later
// candidate may take the request too, should this attempt fail before its answer
// begins.
func (m *Model) Pick(i int, f refusal.Family, now time.Time, take bool) (pick int, more bool, earliest time.Time) {
	pick = -1
	for ; i < len(m.Candidates); i++ {
		up := m.Candidates[i].Up
		if !up.Serves(f) {
			continue
		}
		if cd := up.Cooldown; cd.Out(now) {
			// A billing cooldown past its interval waits for a probe.
			at := cd.Until()
			if !at.After(now) {
				at = now.Add(time.Second)
			}
			earliest = earlier(earliest, at)
			continue
		}
		b := up.Breaker
		switch {
		case pick >= 0:
			if ok, _ := b.Available(now); ok {
				return pick, true, time.Time{}
			}
			continue
		case take && b.Allow(now):
			pick = i
			continue
		}
		ok, at := b.Available(now)
		if ok && !take {
			return i, false, time.Time{}
		}
		earliest = earlier(earliest, at)
	}
	if pick >= 0 {
		return pick, false, time.Time{}
	}
	return -1, false, earliest
}

func earlier(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// Attempt is a request's failover state: which candidate of its model each attempt
// goes to, and what the answers said. The zero value, without a Model, is a request
// to an upstream outside the registry.
type Attempt struct {
	Model *Model
	// Body is the request body as the estimate read it, for a provider model's rewrite.
	Body []byte
	// Cand is the candidate of the current attempt; First the one the request's slot
	// was taken at: the first attempt goes there, a failover to the ones after it.
	Cand  *Candidate
	First int
	// Rename is the model a budget's fallback serves the request with, and Fallback
	// says so in the fallback header.
	Rename, Fallback string
	// at is Cand's index; more says a later candidate may take the request, and retry
	// that the current attempt failed before its answer began, and the next takes it.
	at          int
	more, retry bool
}

// Next picks the next attempt's candidate (Pick): from First for the first attempt,
// after the last one's for a failover. It returns nil and the earliest time one may
// when no candidate may take the request.
func (a *Attempt) Next(f refusal.Family, now time.Time) (*Candidate, time.Time) {
	from := a.First
	if a.Cand != nil {
		from = a.at + 1
	}
	i, more, earliest := a.Model.Pick(from, f, now, true)
	if i < 0 {
		return nil, earliest
	}
	a.at, a.more, a.retry, a.Cand = i, more, false, &a.Model.Candidates[i]
	return a.Cand, time.Time{}
}

// Retry reports whether the current attempt failed before its answer began and the
// next candidate takes the request.
func (a *Attempt) Retry() bool { return a.retry }

// Answered records the current attempt's answer in its upstream's health: an answer
// saying the provider account is out of credit (health.Billing, read from body, the
// start of the answer's body) puts its credential on a billing cooldown; another 429
// cools it for as long as the answer asks (bounded); a 5xx counts against its
// breaker, any other answer for it (a caller's 4xx says nothing against the
// upstream). It reports true when the answer is dropped for the next candidate's: a
// billing answer, a 429 or a 5xx with another candidate that may take the request.
func (a *Attempt) Answered(code int, h http.Header, body []byte, now time.Time, log *slog.Logger) bool {
	up := a.Cand.Up
	failed := code == http.StatusTooManyRequests || code >= 500
	switch bcode, msg, billing := health.Billing(code, body); {
	case billing:
		up.Breaker.Record(now, health.Unrecorded)
		iv := up.Cooldown.BillAnswer(up.Name, bcode, msg, h, now, up.BillingCooldown)
		log.Warn("Upstream credential on a billing cooldown: the provider account is out of credit", "upstream", up.Name, "model", a.Model.Name,
			"status", code, "code", bcode, "message", msg, "requested", iv.Requested, "applied", iv.Applied, "source", iv.Source)
		failed = true
	case code == http.StatusTooManyRequests:
		up.Breaker.Record(now, health.Unrecorded)
		iv := health.CooldownFor(h, now)
		up.Cooldown.Rate(now, iv, up.Name)
		log.Warn("Upstream credential cooling down after a 429", "upstream", up.Name, "model", a.Model.Name,
			"requested", iv.Requested, "applied", iv.Applied, "source", iv.Source, "clamped", iv.Clamped)
	case code >= 500:
		up.Breaker.Record(now, health.Failure)
	default:
		up.Breaker.Record(now, health.Success)
	}
	if failed && a.more {
		a.retry = true
	}
	return a.retry
}

// Peeks reports whether an answer's status may say that the provider account is out
// of credit, so that the start of its body is read for health.Billing.
func Peeks(code int) bool {
	switch code {
	case http.StatusBadRequest, http.StatusPaymentRequired, http.StatusForbidden, http.StatusTooManyRequests:
		return true
	}
	return false
}

// Failed records a current attempt the upstream did not answer (err; gone when the
// client went away first); it reports true when the next candidate takes the request.
func (a *Attempt) Failed(err error, gone bool, now time.Time) bool {
	up := a.Cand.Up
	if gone {
		up.Breaker.Record(now, health.Unrecorded)
		return false
	}
	up.Breaker.Record(now, health.Failure)
	if a.more && !errors.Is(err, context.Canceled) {
		a.retry = true
	}
	return a.retry
}
