// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"strings"
	"testing"
	"time"
)

func mustTime(t *testing.T, loc *time.Location, s string) time.Time {
	t.Helper()
	v, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestCalendarSpan(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cal        Calendar
		at         string
		start, end string
		hours      float64 // the window's real length
	}{
		{"day", Calendar{Every: EveryDay, TimeZone: "Europe/Berlin"}, "2026-06-10 13:00", "2026-06-10 00:00", "2026-06-11 00:00", 24},
		{"day before the anchor time", Calendar{Every: EveryDay, TimeZone: "Europe/Berlin", At: "06:30"}, "2026-06-10 05:00", "2026-06-09 06:30", "2026-06-10 06:30", 24},
		{"day of the spring change is 23 hours", Calendar{Every: EveryDay, TimeZone: "Europe/Berlin"}, "2026-03-29 12:00", "2026-03-29 00:00", "2026-03-30 00:00", 23},
		{"day of the autumn change is 25 hours", Calendar{Every: EveryDay, TimeZone: "Europe/Berlin"}, "2026-10-25 12:00", "2026-10-25 00:00", "2026-10-26 00:00", 25},
		{"month across the spring change", Calendar{Every: EveryMonth, TimeZone: "Europe/Berlin"}, "2026-03-30 09:00", "2026-03-01 00:00", "2026-04-01 00:00", 31*24 - 1},
		{"February has 28 days", Calendar{Every: EveryMonth, TimeZone: "Europe/Berlin"}, "2026-02-14 09:00", "2026-02-01 00:00", "2026-03-01 00:00", 28 * 24},
		{"the 31st in February is its last day", Calendar{Every: EveryMonth, DayOfMonth: 31}, "2026-03-05 09:00", "2026-02-28 00:00", "2026-03-31 00:00", 31 * 24},
		{"the 31st in a leap February", Calendar{Every: EveryMonth, DayOfMonth: 31}, "2028-02-28 09:00", "2028-01-31 00:00", "2028-02-29 00:00", 29 * 24},
		{"month before its anchor day", Calendar{Every: EveryMonth, DayOfMonth: 15, At: "12:00"}, "2026-01-15 11:59", "2025-12-15 12:00", "2026-01-15 12:00", 31 * 24},
		{"week from monday", Calendar{Every: EveryWeek, TimeZone: "Europe/Berlin"}, "2026-11-29 23:00", "2026-11-23 00:00", "2026-11-30 00:00", 7 * 24},
		{"week from friday 17:00", Calendar{Every: EveryWeek, Weekday: "friday", At: "17:00"}, "2026-11-27 16:59", "2026-11-20 17:00", "2026-11-27 17:00", 7 * 24},
		{"week across the autumn change", Calendar{Every: EveryWeek, TimeZone: "Europe/Berlin"}, "2026-10-25 12:00", "2026-10-19 00:00", "2026-10-26 00:00", 7*24 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loc, _ := tc.cal.Location()
			now := mustTime(t, loc, tc.at)
			start, end := tc.cal.Span(now)
			if want := mustTime(t, loc, tc.start); !start.Equal(want) {
				t.Errorf("start = %v, want %v", start, want)
			}
			if want := mustTime(t, loc, tc.end); !end.Equal(want) {
				t.Errorf("end = %v, want %v", end, want)
			}
			if got := end.Sub(start).Hours(); got != tc.hours {
				t.Errorf("the window lasts %v hours, want %v", got, tc.hours)
			}
			if now.Before(start) || !now.Before(end) {
				t.Errorf("%v is not in [%v, %v)", now, start, end)
			}
			// The instant the window ends starts the next one.
			if s2, _ := tc.cal.Span(end); !s2.Equal(end) {
				t.Errorf("the next window starts at %v, want %v", s2, end)
			}
		})
	}
}

func TestRulesRefuseUnknownWords(t *testing.T) {
	doc := `
upstreams: [{name: a, url: "http://127.0.0.1:1"}]
models: [{name: gpt-4o, price: {input: 2.5, output: 10}}, {name: free}]
rate_limiting:
  storage: memory
  rules:
    - name: r1
      dimension: teams
      amount: dollars
      action: shadow
      windows: [{limit: 1.5, rolling: {period: fortnight}}]
    - name: r2
      dimension: team
      count_by: team
      amount: cost
      windows: [{limit: 25, calendar: {every: month, time_zone: Mars/Olympus, day_of_month: 32}}]
    - name: r2
      dimension: global
      subjects: [x]
      windows: [{limit: 10, rolling: {period: minute}, calendar: {every: day}}]
    - name: r3
      dimension: user
      amount: output_tokens
      windows: [{limit: 1.5, rolling: {period: minute, burst_seconds: -1}}]
`
	_, err := Parse([]byte(doc))
	if err == nil {
		t.Fatal("the document was accepted")
	}
	for _, want := range []string{
		`rate_limiting.rules[0].dimension: unknown word "teams"`,
		`rate_limiting.rules[0].amount: unknown word "dollars"`,
		`rate_limiting.rules[0].action: unknown word "shadow"`,
		`rate_limiting.rules[0].windows[0].rolling.period: unknown word "fortnight"`,
		`rate_limiting.rules[1].count_by: is the rule's own dimension`,
		`rate_limiting.rules[1].amount: cost needs a price for every model the rule governs: models["free"]`,
		`rate_limiting.rules[1]: a calendar window or a cost amount needs rate_limiting.storage: redis`,
		`rate_limiting.rules[1].windows[0].calendar.time_zone: not an IANA time zone`,
		`rate_limiting.rules[1].windows[0].calendar.day_of_month: must be from 1 to 31`,
		`rate_limiting.rules[2].name: "r2" is also the name of rate_limiting.rules[1]`,
		`rate_limiting.rules[2].subjects: a global rule has no subjects`,
		`rate_limiting.rules[2].windows[0]: set exactly one of rolling and calendar`,
		`rate_limiting.rules[3].windows[0].limit: output_tokens are counted in whole numbers, got 1.5`,
		`rate_limiting.rules[3].windows[0].rolling.burst_seconds: must be from 0`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}

func TestRulesAccepted(t *testing.T) {
	doc := `
upstreams: [{name: a, url: "http://127.0.0.1:1"}]
models: [{name: gpt-4o, price: {input: 2.5, output: 10, cached_input: 1.25}}]
rate_limiting:
  storage: redis
  redis: {url: "redis://127.0.0.1:6379"}
  cached_input_weight: 0.1
  rules:
    - name: research/team-budget
      dimension: team
      subjects: [research]
      windows:
        - {limit: 600000, rolling: {period: minute, burst_seconds: 20}}
        - {limit: 1000, calendar: {every: month, time_zone: Europe/Berlin}}
    - name: key-model-requests
      dimension: api_key
      count_by: model
      amount: requests
      action: warn
      windows: [{limit: 50, rolling: {period: minute}}]
    - name: key-dollars
      dimension: api_key
      models: [gpt-4o]
      amount: cost
      windows: [{limit: 25.5, calendar: {every: month, day_of_month: 31, at: "06:00"}}]
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if c.RateLimiting.Rules[0].Amount != AmountTokens || c.RateLimiting.Rules[0].Action != ActionBlock {
		t.Errorf("defaults not applied: %+v", c.RateLimiting.Rules[0])
	}
	if c.RateLimiting.CachedWeight() != 0.1 || c.Models[0].Price.CachedInputPrice() != 1.25 {
		t.Errorf("cached weight or price not read")
	}
	if !c.RateLimiting.Rules[2].Durable() || c.RateLimiting.Rules[1].Durable() {
		t.Errorf("durability misread")
	}
}

// rulesDoc is a document on Redis with a priced model and the rules given.
func rulesDoc(rules string) string {
	return `
upstreams: [{name: a, url: "http://127.0.0.1:1"}]
models: [{name: gpt-4o, price: {input: 2.5, output: 10}}]
rate_limiting:
  storage: redis
  redis: {url: "redis://127.0.0.1:6379"}
  rules:
` + rules
}

func TestRulesTakeTheTokenBudgetsSpellings(t *testing.T) {
	for _, tc := range []struct {
		name, rule string
		check      func(r *Rule) bool
	}{
		{"a capitalised period", `{name: r, dimension: team, windows: [{limit: 100, rolling: {period: Minute}}]}`,
			func(r *Rule) bool { return r.Windows[0].Rolling.Period == PeriodMinute }},
		{"a period in capitals", `{name: r, dimension: team, windows: [{limit: 100, rolling: {period: HOUR}}]}`,
			func(r *Rule) bool { return r.Windows[0].Rolling.Period == PeriodHour }},
		{"a capitalised calendar and weekday", `{name: r, dimension: team, windows: [{limit: 100, calendar: {every: Week, weekday: Friday}}]}`,
			func(r *Rule) bool {
				c := r.Windows[0].Calendar
				return c.Every == EveryWeek && c.Weekday == "friday" && c.WeekdayValue() == time.Friday
			}},
		{"the TokenBudget's amount and action", `{name: r, dimension: team, amount: InputTokens, action: Warn, windows: [{limit: 100, rolling: {period: day}}]}`,
			func(r *Rule) bool { return r.Amount == AmountInputTokens && r.Action == ActionWarn }},
		{"the TokenBudget's dimension and count_by", `{name: r, dimension: PerAPIKey, count_by: Model, windows: [{limit: 100, rolling: {period: day}}]}`,
			func(r *Rule) bool { return r.Dimension == RuleAPIKey && r.CountBy == RuleModel }},
		{"a dimension in capitals", `{name: r, dimension: API_KEY, windows: [{limit: 100, rolling: {period: day}}]}`,
			func(r *Rule) bool { return r.Dimension == RuleAPIKey }},
		{"dollars as a string", `{name: r, dimension: team, amount: Cost, windows: [{limit: "25.50", calendar: {every: Month}}]}`,
			func(r *Rule) bool { return r.Amount == AmountCost && r.Windows[0].Limit == 25.5 }},
		{"tokens as a quantity", `{name: r, dimension: team, windows: [{limit: 600k, rolling: {period: minute}}]}`,
			func(r *Rule) bool { return r.Windows[0].Limit == 600000 }},
		{"tokens as a quoted quantity", `{name: r, dimension: team, windows: [{limit: "1.5M", rolling: {period: minute}}]}`,
			func(r *Rule) bool { return r.Windows[0].Limit == 1500000 }},
		{"tokens as a quoted number", `{name: r, dimension: team, windows: [{limit: "1000", rolling: {period: minute}}]}`,
			func(r *Rule) bool { return r.Windows[0].Limit == 1000 }},
		{"tokens as a number", `{name: r, dimension: team, windows: [{limit: 1000, rolling: {period: minute}}]}`,
			func(r *Rule) bool { return r.Windows[0].Limit == 1000 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(rulesDoc("    - " + tc.rule + "\n")))
			if err != nil {
				t.Fatal(err)
			}
			if r := &c.RateLimiting.Rules[0]; !tc.check(r) {
				t.Errorf("read as %+v (windows %+v)", r, r.Windows)
			}
		})
	}
}

func TestRulesSpelledAnyWayRenderCanonically(t *testing.T) {
	c, err := Parse([]byte(rulesDoc(`    - {name: r, dimension: PerTeam, amount: OutputTokens, action: Block, windows: [{limit: "600k", calendar: {every: Week, weekday: Friday}}]}
`)))
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dimension: team", "amount: output_tokens", "action: block", "limit: 600000", "every: week", "weekday: friday"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the rendered document does not say %q:\n%s", want, out)
		}
	}
	again, err := Parse(out)
	if err != nil {
		t.Fatalf("the rendered document does not parse: %v", err)
	}
	if again.RateLimiting.Rules[0].Windows[0].Limit != 600000 {
		t.Errorf("the rendered limit reads back as %v", again.RateLimiting.Rules[0].Windows[0].Limit)
	}
}

func TestRulesRefuseWhatNoSpellingNames(t *testing.T) {
	for _, tc := range []struct{ rule, want string }{
		{`{name: r, dimension: team, windows: [{limit: 100, rolling: {period: Fortnight}}]}`,
			`rate_limiting.rules[0].windows[0].rolling.period: unknown word "Fortnight": must be one of second, minute, hour, day`},
		{`{name: r, dimension: team, windows: [{limit: 100, calendar: {every: week, weekday: Fri}}]}`,
			`rate_limiting.rules[0].windows[0].calendar.weekday: unknown word "Fri"`},
		{`{name: r, dimension: Teams, windows: [{limit: 100, rolling: {period: day}}]}`,
			`rate_limiting.rules[0].dimension: unknown word "Teams"`},
		{`{name: r, dimension: team, amount: Dollars, windows: [{limit: 100, rolling: {period: day}}]}`,
			`rate_limiting.rules[0].amount: unknown word "Dollars"`},
		{`{name: r, dimension: team, windows: [{limit: "lots", rolling: {period: day}}]}`,
			`rate_limiting.rules[0].windows[0].limit: must be a number or a quantity string such as "25.50" or "600k", got "lots"`},
		{`{name: r, dimension: team, windows: [{limit: [1], rolling: {period: day}}]}`,
			`rate_limiting.rules[0].windows[0].limit: must be a number or a quantity string such as "25.50" or "600k", got [1]`},
		{`{name: r, dimension: team, windows: [{limit: "-5", rolling: {period: day}}]}`,
			`rate_limiting.rules[0].windows[0].limit: must be above 0, got -5`},
		{`{name: r, dimension: team, windows: [{limit: "1.5", rolling: {period: day}}]}`,
			`rate_limiting.rules[0].windows[0].limit: tokens are counted in whole numbers, got 1.5`},
		{`{name: r, dimension: team, windows: [{limit: 100, rolling: {period: day}, burst: 5}]}`,
			`rate_limiting.rules[0].windows[0].burst: unknown field`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			_, err := Parse([]byte(rulesDoc("    - " + tc.rule + "\n")))
			if err == nil {
				t.Fatal("the document was accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("the error does not say %q:\n%v", tc.want, err)
			}
		})
	}
}

func TestRulesOfTenants(t *testing.T) {
	doc := `
upstreams: [{name: a, url: "http://127.0.0.1:1"}]
api_keys:
  - {name: team-a_ci, key_sha256: "` + strings.Repeat("a", 64) + `", team: team-a/research, tenant: team-a}
  - {name: ci, key_sha256: "` + strings.Repeat("b", 64) + `", tenant: Team_A}
rate_limiting:
  rules:
    - {name: team-a/cap, tenant: team-a, dimension: global, windows: [{limit: 10, rolling: {period: minute}}]}
    - {name: team-a/tenants, tenant: team-a, dimension: tenant, windows: [{limit: 10, rolling: {period: minute}}]}
    - {name: team-a/per-tenant, tenant: team-a, dimension: team, count_by: tenant, windows: [{limit: 10, rolling: {period: minute}}]}
    - {name: bad, tenant: "a/b", dimension: global, windows: [{limit: 10, rolling: {period: minute}}]}
    - {name: llm/each-tenant, dimension: per_tenant, windows: [{limit: 10, rolling: {period: minute}}]}
`
	_, err := Parse([]byte(doc))
	if err == nil {
		t.Fatal("the document was accepted")
	}
	for _, want := range []string{
		`api_keys[1].tenant: must be a tenant's name of lowercase letters, digits and '-', got "Team_A"`,
		`rate_limiting.rules[1].tenant: a tenant's rule counts only its own tenant: dimension, count_by and applies_when tenant are the platform's`,
		`rate_limiting.rules[2].tenant: a tenant's rule counts only its own tenant`,
		`rate_limiting.rules[3].tenant: must be a tenant's name`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
	for _, never := range []string{"rules[0]", "rules[4]", "api_keys[0]"} {
		if strings.Contains(err.Error(), never) {
			t.Errorf("the error names %s, which is valid:\n%v", never, err)
		}
	}
}

func TestInFlightRules(t *testing.T) {
	ok := `
upstreams: [{name: a, url: "http://127.0.0.1:1"}]
rate_limiting:
  budget_division: {replicas: 3}
  rules:
    - {name: two-per-session, dimension: api_key, count_by: session, amount: in_flight, windows: [{limit: 2}]}
`
	cfg, err := Parse([]byte(ok))
	if err != nil {
		t.Fatalf("an in_flight rule of one window, its limit alone, under memory storage: %v", err)
	}
	if r := cfg.RateLimiting.Rules[0]; r.Amount != AmountInFlight || r.Windows[0].Limit != 2 {
		t.Fatalf("read as %+v", r)
	}
	bad := `
upstreams: [{name: a, url: "http://127.0.0.1:1"}]
rate_limiting:
  rules:
    - {name: r0, dimension: api_key, amount: in_flight, windows: [{limit: 2, rolling: {period: minute}}]}
    - {name: r1, dimension: api_key, amount: in_flight, windows: [{limit: 2}, {limit: 3}]}
    - {name: r2, dimension: api_key, amount: in_flight, action: warn, windows: [{limit: 1.5}]}
    - {name: r3, dimension: api_key, amount: requests, windows: [{limit: 2}]}
`
	_, err = Parse([]byte(bad))
	if err == nil {
		t.Fatal("the document was accepted")
	}
	for _, want := range []string{
		`rate_limiting.rules[0].windows[0]: an in_flight window is its limit alone: no rolling or calendar period`,
		`rate_limiting.rules[1].windows: an in_flight rule has one window, its limit`,
		`rate_limiting.rules[2].action: an in_flight rule blocks`,
		`rate_limiting.rules[2].windows[0].limit: in_flight are counted in whole numbers, got 1.5`,
		`rate_limiting.rules[3].windows[0]: set exactly one of rolling and calendar`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}
