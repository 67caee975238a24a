// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"context"
	"fmt"
	"strings"
)

// Check is one target of a mission and whether a run met it.
type Check struct {
	Target string
	Got    string
	OK     bool
}

// Outcome is one mission's runs and its checks.
type Outcome struct {
	Mission string
	// Question is what the mission asks.
	Question string
	Runs     []*Result
	Checks   []Check
}

// OK reports whether every check passed.
func (o *Outcome) OK() bool {
	for _, c := range o.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

func (o *Outcome) check(ok bool, target, got string, args ...any) {
	o.Checks = append(o.Checks, Check{Target: target, Got: fmt.Sprintf(got, args...), OK: ok})
}

// tokens gives every tenant of the kinds the same tokens-per-minute limit.
func (w *World) tokens(tpm int64, kinds ...string) map[string]int64 {
	out := map[string]int64{}
	for _, t := range w.Tenants {
		for _, k := range kinds {
			if t.Kind == k {
				out[t.Name] = tpm
			}
		}
	}
	return out
}

func merge(ms ...map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func (w *World) buckets(seconds float64, kind string) map[string]float64 {
	out := map[string]float64{}
	for _, t := range w.Of(kind) {
		out[t.Name] = seconds
	}
	return out
}

// Policies of the missions.

// CalibrationPolicies are the unlimited first-in-first-out runs without and with the
// agent; the second keeps the 400 requests-per-minute limit, which must never trigger.
func (w *World) CalibrationPolicies() []Policy {
	return []Policy{
		{Name: "fifo, no limits"},
		{Name: "fifo, agent, 400 rpm", Agent: true, RequestsPerMinute: w.Missions.RequestsPerMinute},
	}
}

// MissionOnePolicy limits every tenant's tokens per minute, agent on.
func (w *World) MissionOnePolicy() Policy {
	return Policy{Name: fmt.Sprintf("agent, %s tpm per tenant", human(w.Missions.TokenLimitPerMinute)), Agent: true,
		TokensPerMinute: w.tokens(w.Missions.TokenLimitPerMinute, KindChat, KindBatch, KindAgent),
		BucketSeconds:   merge2(w.buckets(w.Missions.TokenLimitBucketSeconds, KindChat), w.buckets(w.Missions.TokenLimitBucketSeconds, KindBatch), w.buckets(w.Missions.TokenLimitBucketSeconds, KindAgent))}
}

func merge2(ms ...map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// MissionTwoPolicies are the apps' contract under the burst with each bucket size.
func (w *World) MissionTwoPolicies() []Policy {
	var out []Policy
	for _, s := range w.Missions.BucketSeconds {
		out = append(out, Policy{Name: fmt.Sprintf("burst, %s tpm, %gs bucket", human(w.Missions.AppContractPerMinute), s), Burst: true,
			TokensPerMinute: w.tokens(w.Missions.AppContractPerMinute, KindChat), BucketSeconds: w.buckets(s, KindChat)})
	}
	return out
}

// MissionThreePolicy runs the heavy batch through the scheduler, every tenant at the
// scheduled limit.
func (w *World) MissionThreePolicy() Policy {
	return Policy{Name: fmt.Sprintf("heavy batch, scheduler, %s tpm", human(w.Missions.ScheduledLimitPerMinute)), HeavyBatch: true, Scheduler: true,
		TokensPerMinute: w.tokens(w.Missions.ScheduledLimitPerMinute, KindChat, KindBatch, KindAgent)}
}

// StaticPolicies are mission three's sweep: first-in-first-out with a static limit
// per tenant.
func (w *World) StaticPolicies() []Policy {
	var out []Policy
	for _, l := range w.Missions.StaticLimitsPerMinute {
		out = append(out, Policy{Name: fmt.Sprintf("heavy batch, fifo, %s tpm", human(l)), HeavyBatch: true,
			TokensPerMinute: w.tokens(l, KindChat, KindBatch, KindAgent)})
	}
	return out
}

// MissionFourPolicy has the agent, the burst and the heavy batch at once, every tenant
// with a token limit, and the scheduler.
func (w *World) MissionFourPolicy() Policy {
	m := w.Missions
	bucket := m.BucketSeconds[len(m.BucketSeconds)-1]
	return Policy{Name: "agent, burst, heavy batch, scheduler", Agent: true, Burst: true, HeavyBatch: true, Scheduler: true,
		TokensPerMinute: merge(w.tokens(m.AppContractPerMinute, KindChat), w.tokens(m.BatchLimitPerMinute, KindBatch),
			w.tokens(m.AgentLimitPerMinute, KindAgent)),
		BucketSeconds: merge2(w.buckets(bucket, KindChat), w.buckets(m.TokenLimitBucketSeconds, KindAgent),
			w.buckets(m.TokenLimitBucketSeconds, KindBatch))}
}

// Missions.

// Calibration checks the unlimited first-in-first-out run against the world's figures.
func (w *World) Calibration(ctx context.Context) (*Outcome, error) {
	o := &Outcome{Mission: "calibration", Question: "the unlimited first-in-first-out run reproduces the world's figures: with the agent, interactive p95 queue wait 8 s ± 25%, 70% ± 5 points of chat requests start within 2 s, and 400 requests per minute never triggers"}
	for _, p := range w.CalibrationPolicies() {
		r, err := w.Run(ctx, p)
		if err != nil {
			return nil, err
		}
		o.Runs = append(o.Runs, r)
	}
	quiet, agent := o.Runs[0].Summarize(), o.Runs[1].Summarize()
	o.check(quiet.ChatWithinTarget >= 0.99, "without the agent, ≥ 99% of chat starts within target", "%.1f%%", 100*quiet.ChatWithinTarget)
	p95 := agent.ChatWaitP95.Seconds()
	o.check(p95 >= 6 && p95 <= 10, "with the agent, interactive p95 queue wait 8 s ± 25%", "%.1f s", p95)
	o.check(agent.ChatWithinTarget >= 0.65 && agent.ChatWithinTarget <= 0.75, "with the agent, 70% ± 5 points of chat starts within 2 s", "%.1f%%", 100*agent.ChatWithinTarget)
	o.check(total(agent.Refused) == 0, "the 400 requests-per-minute limit never triggers", "%d refused", total(agent.Refused))
	return o, nil
}

// MissionOne shows token limits capping the agent where request limits cannot.
func (w *World) MissionOne(ctx context.Context, requestLimited *Result) (*Outcome, error) {
	o := &Outcome{Mission: "mission one", Question: "token limits cap the runaway agent where a request limit cannot"}
	r, err := w.Run(ctx, w.MissionOnePolicy())
	if err != nil {
		return nil, err
	}
	if requestLimited != nil {
		o.Runs = append(o.Runs, requestLimited)
	}
	o.Runs = append(o.Runs, r)
	s := r.Summarize()
	limit := float64(w.Missions.TokenLimitPerMinute) / 60
	if requestLimited != nil {
		q := requestLimited.Summarize()
		o.check(total(q.Refused) == 0 && q.ChatWithinTarget < 0.8, "a request limit refuses nothing while chat suffers",
			"%d refused, %.1f%% of chat within target", total(q.Refused), 100*q.ChatWithinTarget)
	}
	// The agent's bucket starts full: over the run it may take one bucket plus the
	// refill.
	ceiling := (limit*max(w.Missions.TokenLimitBucketSeconds, 0) + limit*w.DurationSeconds) / w.DurationSeconds
	o.check(s.Refused[w.name(KindAgent)] > 0 && s.AgentTokensPerSecond <= ceiling*1.02, "the token limit caps the agent",
		"%d agent requests refused, agent %.0f tok/s (limit %.0f/s refill + one bucket)", s.Refused[w.name(KindAgent)], s.AgentTokensPerSecond, limit)
	o.check(s.ChatWithinTarget >= 0.95, "chat is restored: ≥ 95% starts within target", "%.1f%%", 100*s.ChatWithinTarget)
	o.check(s.ChatRefused == 0, "no chat request is refused", "%d", s.ChatRefused)
	return o, nil
}

// MissionTwo sizes the bucket for the burst under a fixed contract.
func (w *World) MissionTwo(ctx context.Context) (*Outcome, error) {
	o := &Outcome{Mission: "mission two", Question: "size the apps' bucket so a 30-second promotion at 2.5 times the rate is absorbed without raising the 200,000 tokens-per-minute contract"}
	var fracs []float64
	for _, p := range w.MissionTwoPolicies() {
		r, err := w.Run(ctx, p)
		if err != nil {
			return nil, err
		}
		o.Runs = append(o.Runs, r)
		s := r.Summarize()
		fracs = append(fracs, float64(s.ChatRefused)/float64(max(1, s.ChatRequests)))
	}
	size := w.SizeApps()
	o.check(fracs[0] > 0.02, fmt.Sprintf("a %gs bucket rejects interactive requests in the burst", w.Missions.BucketSeconds[0]), "%.1f%% refused", 100*fracs[0])
	last := len(fracs) - 1
	o.check(fracs[last] < 0.005, fmt.Sprintf("a %gs bucket absorbs it (< 0.5%% refused)", w.Missions.BucketSeconds[last]), "%.1f%% refused", 100*fracs[last])
	o.check(size.Seconds <= w.Missions.BucketSeconds[last], "the sizing rule's bucket fits within the bucket that absorbs it",
		"%.0f tokens = %.1f s of refill", size.Tokens, size.Seconds)
	return o, nil
}

// MissionThree asks for 5,000 batch output tokens per second and 99% of interactive starting
// within target, with the scheduler; the sweep of static limits misses one.
func (w *World) MissionThree(ctx context.Context, sweep bool) (*Outcome, error) {
	m := w.Missions
	o := &Outcome{Mission: "mission three", Question: fmt.Sprintf("%.0f batch output tokens per second and %.0f%% of interactive requests starting within %gs, which no static limit achieves",
		m.BatchOutputTokensPerSecond, 100*m.InteractiveWithinTarget, w.InteractiveTargetSeconds)}
	r, err := w.Run(ctx, w.MissionThreePolicy())
	if err != nil {
		return nil, err
	}
	o.Runs = append(o.Runs, r)
	s := r.Summarize()
	o.check(s.BatchOutputPerSecond >= m.BatchOutputTokensPerSecond, fmt.Sprintf("with the scheduler, batch ≥ %.0f output tok/s", m.BatchOutputTokensPerSecond), "%.0f tok/s", s.BatchOutputPerSecond)
	o.check(s.ChatWithinTarget >= m.InteractiveWithinTarget, fmt.Sprintf("with the scheduler, ≥ %.0f%% of chat starts within target", 100*m.InteractiveWithinTarget), "%.1f%%", 100*s.ChatWithinTarget)
	if !sweep {
		return o, nil
	}
	both := 0
	for _, p := range w.StaticPolicies() {
		r, err := w.Run(ctx, p)
		if err != nil {
			return nil, err
		}
		o.Runs = append(o.Runs, r)
		s := r.Summarize()
		if s.BatchOutputPerSecond >= m.BatchOutputTokensPerSecond && s.ChatWithinTarget >= m.InteractiveWithinTarget {
			both++
		}
	}
	o.check(both == 0, "every static limit misses one of the two targets", "%d of %d meet both", both, len(m.StaticLimitsPerMinute))
	return o, nil
}

// MissionFour runs the agent, the burst and heavy batch at once, every tenant with a token
// limit, through the scheduler.
func (w *World) MissionFour(ctx context.Context) (*Outcome, error) {
	m := w.Missions
	o := &Outcome{Mission: "mission four", Question: "the agent, the burst and heavy batch at once, every tenant with a token limit: chat stays fast"}
	r, err := w.Run(ctx, w.MissionFourPolicy())
	if err != nil {
		return nil, err
	}
	o.Runs = append(o.Runs, r)
	s := r.Summarize()
	o.check(s.ChatWithinTarget >= m.InteractiveWithinTarget, fmt.Sprintf("≥ %.0f%% of chat starts within target", 100*m.InteractiveWithinTarget), "%.1f%%", 100*s.ChatWithinTarget)
	o.check(float64(s.ChatRefused) < 0.005*float64(s.ChatRequests), "the burst is absorbed (< 0.5% of chat refused)", "%d of %d refused", s.ChatRefused, s.ChatRequests)
	o.check(s.Refused[w.name(KindAgent)] > 0, "the agent is held to its limit", "%d agent requests refused", s.Refused[w.name(KindAgent)])
	o.check(s.BatchOutputPerSecond > 0.4*m.BatchOutputTokensPerSecond, fmt.Sprintf("batch keeps more than %.0f output tok/s", 0.4*m.BatchOutputTokensPerSecond), "%.0f output tok/s", s.BatchOutputPerSecond)
	return o, nil
}

func (w *World) name(kind string) string {
	if ts := w.Of(kind); len(ts) > 0 {
		return ts[0].Name
	}
	return ""
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// human writes a token count as 800k or 1.4M.
func human(n int64) string {
	switch {
	case n >= 1000000:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/1e6), ".0") + "M"
	case n >= 1000:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}
