// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Providers are the families of the model registry and the upstreams' health:
// pre-check refusals, failovers and fallbacks as counters, and each upstream's
// breaker state and cooldown time read from the proxy's health state at scrape time.
type Providers struct {
	// ContextRefusals is tokenwarden_context_window_refusals_total{model,limit}: requests
	// refused before any budget or upstream because they cannot fit the model's
	// context window (limit context_window) or ask for more output than it generates
	// (limit max_output_tokens).
	ContextRefusals *prometheus.CounterVec
	// ContextClamps is tokenwarden_context_window_clamps_total{model,limit}: requests
	// forwarded with their output cap lowered to what the model (limit
	// max_output_tokens) or its context window (limit context_window) leaves, under the
	// admission policy clamp.
	ContextClamps *prometheus.CounterVec
	// Failovers is tokenwarden_failovers_total{model}: attempts moved to a model's next
	// upstream after an error before the answer began.
	Failovers *prometheus.CounterVec
	// Unavailable is tokenwarden_model_unavailable_total{model}: requests answered 503
	// because every upstream of their model was down or cooling.
	Unavailable *prometheus.CounterVec
	// Fallbacks is tokenwarden_fallbacks_total{model,served}: requests a model-scoped
	// budget refused that a cheaper model served instead.
	Fallbacks *prometheus.CounterVec
	// Substitutions is tokenwarden_unavailable_fallbacks_total{model,served}: requests
	// whose model had no upstream available that its unavailable_fallback served,
	// before any attempt.
	Substitutions *prometheus.CounterVec

	source    atomic.Pointer[func() []UpstreamHealth]
	state     *prometheus.Desc
	cooled    *prometheus.Desc
	cooling   *prometheus.Desc
	requested *prometheus.Desc
	applied   *prometheus.Desc
}

// UpstreamHealth is one upstream's health as the metrics read it.
type UpstreamHealth struct {
	Upstream string
	// State is closed, open or half_open.
	State string
	// CooldownSeconds is the total time its credential has been put on cooldown for
	// rate pressure.
	CooldownSeconds float64
	// Cooling is the reason its credential is out now (rate or billing), empty when
	// it is not; Requested and Applied are that cooldown's intervals in seconds.
	Cooling            string
	Requested, Applied float64
}

// BreakerStates are the values of the state label.
var BreakerStates = []string{"closed", "open", "half_open"}

// CoolingReasons are the values of the reason label.
var CoolingReasons = []string{"rate", "billing"}

func newProviders(reg prometheus.Registerer) *Providers {
	p := &Providers{
		ContextRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_context_window_refusals_total",
			Help: "Requests refused with 400 before any budget or upstream because they cannot fit the model's context window (limit context_window) or ask for more output than it generates (limit max_output_tokens), by model.",
		}, []string{"model", "limit"}),
		ContextClamps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_context_window_clamps_total",
			Help: "Requests forwarded with their output cap lowered to what the model generates (limit max_output_tokens) or its context window leaves (limit context_window), under the admission policy clamp, by model.",
		}, []string{"model", "limit"}),
		Failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_failovers_total",
			Help: "Requests moved to their model's next upstream after an upstream error before any byte reached the client, by model.",
		}, []string{"model"}),
		Unavailable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_model_unavailable_total",
			Help: "Requests answered 503 because every upstream of their model had an open breaker or a cooling credential, by model.",
		}, []string{"model"}),
		Fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_fallbacks_total",
			Help: "Requests a model-scoped budget refused that a cheaper model served instead, by the model asked for and the model served.",
		}, []string{"model", "served"}),
		Substitutions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_unavailable_fallbacks_total",
			Help: "Requests whose model had no upstream available that the model's unavailable_fallback served instead, before any attempt, by the model asked for and the model served.",
		}, []string{"model", "served"}),
		state: prometheus.NewDesc("tokenwarden_upstream_breaker_state",
			"The circuit breaker state of each upstream of the model registry: 1 for the state it is in (closed, open, half_open), 0 for the others.",
			[]string{"upstream", "state"}, nil),
		cooled: prometheus.NewDesc("tokenwarden_upstream_cooldown_seconds_total",
			"Seconds the upstream's credential has been put on cooldown after 429s of rate pressure; its rate is the share of time it cools.",
			[]string{"upstream"}, nil),
		cooling: prometheus.NewDesc("tokenwarden_upstream_cooling",
			"Whether the upstream's credential is out of candidacy now, by reason: rate (a 429 of rate pressure) or billing (its provider account is out of credit, until a probe finds it answering); 1 for the reason in force, 0 for the other.",
			[]string{"upstream", "reason"}, nil),
		requested: prometheus.NewDesc("tokenwarden_upstream_cooldown_requested_seconds",
			"The interval the provider's answer asked for, of the cooldown in force on the upstream's credential (0: the answer gave no timing).",
			[]string{"upstream", "reason"}, nil),
		applied: prometheus.NewDesc("tokenwarden_upstream_cooldown_applied_seconds",
			"The interval applied, of the cooldown in force on the upstream's credential.",
			[]string{"upstream", "reason"}, nil),
	}
	reg.MustRegister(p.ContextRefusals, p.ContextClamps, p.Failovers, p.Unavailable, p.Fallbacks, p.Substitutions, healthCollector{p})
	return p
}

// SetHealthSource sets what the breaker and cooldown families read at each scrape.
func (p *Providers) SetHealthSource(fn func() []UpstreamHealth) { p.source.Store(&fn) }

type healthCollector struct{ p *Providers }

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.p.state
	ch <- c.p.cooled
	ch <- c.p.cooling
	ch <- c.p.requested
	ch <- c.p.applied
}

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	fn := c.p.source.Load()
	if fn == nil {
		return
	}
	for _, u := range (*fn)() {
		for _, s := range BreakerStates {
			v := 0.0
			if s == u.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.p.state, prometheus.GaugeValue, v, u.Upstream, s)
		}
		ch <- prometheus.MustNewConstMetric(c.p.cooled, prometheus.CounterValue, u.CooldownSeconds, u.Upstream)
		for _, r := range CoolingReasons {
			v := 0.0
			if r == u.Cooling {
				v = 1
				ch <- prometheus.MustNewConstMetric(c.p.requested, prometheus.GaugeValue, u.Requested, u.Upstream, r)
				ch <- prometheus.MustNewConstMetric(c.p.applied, prometheus.GaugeValue, u.Applied, u.Upstream, r)
			}
			ch <- prometheus.MustNewConstMetric(c.p.cooling, prometheus.GaugeValue, v, u.Upstream, r)
		}
	}
}
