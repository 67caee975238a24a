// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// AgentMetrics are the families of who goes first and of the limits for agents
// (docs/scheduling.md): refusals by class and reason, the backend work served by
// team, and the clients' retries.
type AgentMetrics struct {
	ClassRefusals *prometheus.CounterVec // tokenwarden_class_refusals_total{class,reason}
	TeamUsage     *prometheus.CounterVec // tokenwarden_team_usage_tokens_total{team,type}
	Retries       *prometheus.CounterVec // tokenwarden_client_retries_total{route}

	teamUsage sync.Map // team -> *[2]prometheus.Counter (input, output)
}

func (a *AgentMetrics) register(reg prometheus.Registerer) {
	a.ClassRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenwarden_class_refusals_total",
		Help: "Requests the proxy refused, by priority class and reason: queue_timeout, queue_full, in_flight_limit, run_budget_exceeded, run_steps_exceeded, max_tokens_above_class_cap, invalid_run_id, or the budget's limit type (token_budget, requests, cost_budget).",
	}, []string{"class", "reason"})
	a.TeamUsage = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenwarden_team_usage_tokens_total",
		Help: "Tokens the upstreams served, by the team of the API key and type (input, output), from the usage the upstream reported: each team's share of the backend's work.",
	}, []string{"team", "type"})
	a.Retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenwarden_client_retries_total",
		Help: "Requests that said they were a client's retry (x-stainless-retry-count above 0, sent by the official OpenAI and Anthropic SDKs), by route; against tokenwarden_requests_total it is the retry amplification.",
	}, []string{"route"})
	reg.MustRegister(a.ClassRefusals, a.TeamUsage, a.Retries)
}

// Refused counts a refusal of a request of class (a class word) for reason.
func (a *AgentMetrics) Refused(class, reason string) {
	a.ClassRefusals.WithLabelValues(class, reason).Inc()
}

// Retried counts a request on route that a client sent again.
func (a *AgentMetrics) Retried(route string) { a.Retries.WithLabelValues(route).Inc() }

// AddTeamUsage counts the tokens served to a team's key.
func (a *AgentMetrics) AddTeamUsage(team string, input, output int64) {
	if team == "" {
		return
	}
	c := pair(&a.teamUsage, a.TeamUsage, team)
	c[0].Add(float64(input))
	c[1].Add(float64(output))
}

// ForgetTeams drops the series of teams keep reports false for.
func (a *AgentMetrics) ForgetTeams(keep func(team string) bool) {
	a.teamUsage.Range(func(k, _ any) bool {
		if t := k.(string); !keep(t) {
			a.teamUsage.Delete(t)
			a.TeamUsage.DeletePartialMatch(prometheus.Labels{"team": t})
		}
		return true
	})
}
