// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// rolling is a rule's rolling counter of capacity over period, for one subject.
func rolling(rule string, window uint8, dim budget.Dimension, id, by string, capacity float64, period time.Duration) budget.Charge {
	r := capacity / period.Seconds()
	return budget.Charge{Key: budget.Key{Kind: budget.Rolling, Dim: dim, Rule: rule, Window: window, ID: id, By: by},
		Capacity: capacity, Rate: r, SharedCapacity: capacity, SharedRate: r, Period: period}
}

// calendarCounter is a rule's calendar counter of the window that starts at start and
// ends at end.
func calendarCounter(rule string, window uint8, dim budget.Dimension, id string, capacity float64, start, end time.Time) budget.Charge {
	return budget.Charge{Key: budget.Key{Kind: budget.Calendar, Dim: dim, Rule: rule, Window: window, ID: id, Start: start.Unix()},
		Capacity: capacity, SharedCapacity: capacity, EndMillis: end.UnixMilli(), Durable: true}
}

// findRule returns a report's rule window.
func findRule(u *Usage, rule string, window int) *RuleUsage {
	for i := range u.Rules {
		if u.Rules[i].Rule == rule && u.Rules[i].Window == window {
			return &u.Rules[i]
		}
	}
	return nil
}

// TestSummaryRulesMemory drains rule counters of a replica's memory: a global rule's
// one counter, a per-key request rule with one key at its limit, a cost rule in
// dollars, a calendar window whose ended window is left out; and the refusals by
// rule window.
func TestSummaryRulesMemory(t *testing.T) {
	c := &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	mem := budget.NewMemory(c, 1000)
	refusals := &Refusals{}
	s := &Summarizer{Levels: mem, Refusals: refusals, Every: 15 * time.Second}

	reserve(t, mem, 600, rolling("llm/fleet", 0, budget.Global, "", "", 1000, time.Minute))
	reserve(t, mem, 5, rolling("llm/keys/requests", 0, budget.APIKey, "alice", "", 5, time.Second))
	reserve(t, mem, 1, rolling("llm/keys/requests", 0, budget.APIKey, "bob", "", 5, time.Second))
	if res, err := mem.Reserve(context.Background(), &budget.Reservation{Tokens: budget.WithAmount(
		[]budget.Charge{rolling("llm/spend", 1, budget.Team, "ml", "gpt-4o", 10, time.Hour)}, 0.25)}); err != nil || !res.Admitted {
		t.Fatal(res, err)
	}
	day := c.t.Truncate(24 * time.Hour)
	reserve(t, mem, 900, calendarCounter("llm/monthly", 0, budget.User, "ann", 1000, day.Add(-24*time.Hour), day))
	reserve(t, mem, 30, calendarCounter("llm/monthly", 0, budget.User, "ann", 1000, day, day.Add(24*time.Hour)))
	refusals.RefusedRule("llm/fleet", 0)
	refusals.RefusedRule("llm/fleet", 0)
	refusals.RefusedRule("llm/quiet", 2)
	refusals.Refused(budget.Global, budget.TokensMinute, "")

	u := summary(t, s)
	g := findRule(u, "llm/fleet", 0)
	if g == nil || g.InUse != 1 || len(g.Top) != 1 || g.Top[0] != (RuleTop{Used: 600, Capacity: 1000}) || g.Refused != 2 || g.Calendar {
		t.Fatalf("the global rule: %s", u.Encode())
	}
	k := findRule(u, "llm/keys/requests", 0)
	if k == nil || k.InUse != 2 || k.AtLimit != 1 || len(k.Top) != 2 || k.Top[0].ID != "alice" || k.Top[0].Used != 5 || k.Top[1].ID != "bob" {
		t.Fatalf("the per-key request rule: %s", u.Encode())
	}
	sp := findRule(u, "llm/spend", 1)
	if sp == nil || len(sp.Top) != 1 || sp.Top[0] != (RuleTop{ID: "ml", By: "gpt-4o", Used: 0.25, Capacity: 10}) {
		t.Fatalf("the cost rule: %s", u.Encode())
	}
	m := findRule(u, "llm/monthly", 0)
	if m == nil || !m.Calendar || m.InUse != 1 || m.AtLimit != 0 || m.Top[0] != (RuleTop{ID: "ann", Used: 30, Capacity: 1000}) {
		t.Fatalf("the calendar window counts only the present window's spend: %s", u.Encode())
	}
	if q := findRule(u, "llm/quiet", 2); q == nil || q.Refused != 1 || q.InUse != 0 {
		t.Fatalf("a refusing window without use: %s", u.Encode())
	}
	if gl := find(u, "global", ""); gl == nil || gl.Refused.Minute != 1 {
		t.Fatalf("the limits' refusals stay apart: %s", u.Encode())
	}
	if u.Rules[0].Rule != "llm/fleet" && u.Rules[0].Rule != "llm/keys/requests" {
		t.Fatalf("the most used rule windows come first: %s", u.Encode())
	}

	// An hour on, the rolling counters refilled; the calendar window's spend stays, and
	// the report of an idle replica no longer changes once the refusals aged out.
	c.t = c.t.Add(time.Hour)
	for range RefusalScans {
		summary(t, s)
	}
	idle := summary(t, s)
	c.t = c.t.Add(time.Minute)
	if again := summary(t, s); again.Encode() != idle.Encode() || len(idle.Rules) != 1 || idle.Rules[0].Rule != "llm/monthly" {
		t.Fatalf("an idle replica's report: %s, then %s", idle.Encode(), again.Encode())
	}
}

// TestSummaryRulesRedis reads rule counters of the fleet's shared store, whichever
// replica drew on them: subjects and count_by values that hold colons, a calendar
// window's spend since its start, in dollars.
func TestSummaryRulesRedis(t *testing.T) {
	srv := redisserver.Start(t)
	shared, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: "llm/fleet"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shared.Close() })
	other, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: "llm/fleet"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })

	reserve(t, other, 980, rolling("llm/teams", 0, budget.Team, "ml", "", 1000, time.Minute))
	reserve(t, other, 40, rolling("llm/clients", 1, budget.Client, "2001:db8::/64", "org:gpt@2", 100, time.Hour))
	now, _ := shared.CalendarNow()
	start := now.Truncate(24 * time.Hour)
	if res, err := other.Reserve(context.Background(), &budget.Reservation{Tokens: budget.WithAmount(
		[]budget.Charge{calendarCounter("llm/spend", 0, budget.Global, "", 50, start, start.Add(24*time.Hour))}, 12.5)}); err != nil || !res.Admitted {
		t.Fatal(res, err)
	}
	reserve(t, other, 10, tokens(budget.TokensMinute, budget.User, "ann", 1000))

	u := summary(t, &Summarizer{Levels: shared, Shared: true, Every: 15 * time.Second})
	if !u.Shared {
		t.Fatalf("not shared: %s", u.Encode())
	}
	tm := findRule(u, "llm/teams", 0)
	if tm == nil || tm.AtLimit != 1 || tm.Top[0].ID != "ml" || tm.Top[0].Capacity != 1000 || tm.Top[0].Used < 979 || tm.Top[0].Used > 980 {
		t.Fatalf("the team rule: %s", u.Encode())
	}
	cl := findRule(u, "llm/clients", 1)
	if cl == nil || cl.Top[0].ID != "2001:db8::/64" || cl.Top[0].By != "org:gpt@2" || cl.Calendar {
		t.Fatalf("the client rule: %s", u.Encode())
	}
	sp := findRule(u, "llm/spend", 0)
	if sp == nil || !sp.Calendar || sp.Top[0] != (RuleTop{Used: 12.5, Capacity: 50}) {
		t.Fatalf("the calendar window: %s", u.Encode())
	}
	if usr := find(u, "user", ""); usr == nil || usr.Top[0].Used != 10 {
		t.Fatalf("the limits' buckets beside the rules: %s", u.Encode())
	}
}

// TestSummaryRulesBounded: a report with thousands of rule windows in use keeps the
// most used within MaxUsageBytes, and says how many it left out.
func TestSummaryRulesBounded(t *testing.T) {
	c := &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	mem := budget.NewMemory(c, 100000)
	const rules = 3000
	for i := range rules {
		reserve(t, mem, int64(1+i%1000), rolling(fmt.Sprintf("team-%04d/budget-with-a-long-name", i), 0, budget.Team, "research", "", 1000, time.Hour))
	}
	u, err := (&Summarizer{Levels: mem, Every: 15 * time.Second}).Summary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	enc := u.Encode()
	if len(enc) > MaxUsageBytes || u.Cut == 0 || u.Cut+len(u.Rules) != rules {
		t.Fatalf("%d bytes, %d rule windows, %d cut", len(enc), len(u.Rules), u.Cut)
	}
	if least := u.Rules[len(u.Rules)-1]; least.Top[0].Used < 1000-float64(len(u.Rules)/3)-1 {
		t.Fatalf("kept a window using %v of 1000 among %d: the most used come first", least.Top[0].Used, len(u.Rules))
	}
	t.Logf("%d rule windows in use: the report holds %d in %d bytes and leaves out %d", rules, len(u.Rules), len(enc), u.Cut)
}

// BenchmarkSummaryRulesMemory scans a replica's memory holding 50,000 keys' counters
// of a per-key rule with a minute and a day window, every one in use.
func BenchmarkSummaryRulesMemory(b *testing.B) {
	mem := budget.NewMemory(budget.SystemClock{}, 1<<20)
	for i := range 50000 {
		id := fmt.Sprintf("team-%03d_key-%05d", i%300, i)
		res, err := mem.Reserve(context.Background(), &budget.Reservation{Tokens: budget.WithAmount([]budget.Charge{
			rolling("llm/per-key", 0, budget.APIKey, id, "", 1000, time.Minute),
			rolling("llm/per-key", 1, budget.APIKey, id, "", 100000, 24*time.Hour)}, float64(1+i%900))})
		if err != nil || !res.Admitted {
			b.Fatal(res, err)
		}
	}
	s := &Summarizer{Levels: mem, Every: 15 * time.Second}
	var size int
	b.ResetTimer()
	for range b.N {
		u, err := s.Summary(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		size = len(u.Encode())
	}
	b.ReportMetric(float64(size), "report-bytes")
}
