// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net/http"

	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// agentLimits applies the limits for agents (proxy/agentlimit) before budget
// admission, so that a request they refuse takes no reservation: the class's output
// cap (which may rewrite the body and its estimate), the key's in-flight generations,
// and its run's budget and steps. It answers a refusal itself and reports false when
// the request must stop.
func (ex *exchange) agentLimits(w http.ResponseWriter, r *http.Request, key *budget.KeyPolicy, body []byte) bool {
	c := schedule.Interactive
	if key != nil {
		c = ex.rt.keySched[key.Name].class
	}
	ex.agent.Class = agentlimit.ClassOf(r.Header, c)
	if ex.route.charged && body != nil && !ex.capOutput(w, r, body) {
		return false
	}
	if key == nil {
		return true
	}
	ks := ex.rt.keySched[key.Name]
	if ref := ex.s.agents.Admit(&ex.agent, ex.s.clock, r.Header, key.Name, ks.limits, ex.est.Total()); ref != nil {
		ex.refuseAgent(w, ref)
		return false
	}
	return true
}

// capOutput applies the class's output cap to a charged request; a changed body is
// estimated again and forwarded plain.
func (ex *exchange) capOutput(w http.ResponseWriter, r *http.Request, body []byte) bool {
	out, est, ref := agentlimit.CapOutput(ex.rt.classLimits[ex.agent.Class], ex.agent.Class, ex.route.name, body, ex.est)
	if ref != nil {
		ex.refuseAgent(w, ref)
		return false
	}
	if out == nil {
		return true
	}
	ex.keepTokenized(&est)
	ex.est = est
	if ex.try.body != nil {
		// An attempt under a provider's model name is rewritten from this body.
		ex.try.body = out
	}
	agentlimit.SetBody(r, out)
	return true
}

// refuseAgent answers a refusal of the limits for agents in the route's shape.
func (ex *exchange) refuseAgent(w http.ResponseWriter, ref *agentlimit.Refusal) {
	if ref.Header != "" {
		w.Header().Set(ref.Header, ref.Value)
	}
	ex.fail(w, ref.Status, ref.Code, ref.Message, &refusal.Body{LimitType: ref.LimitType, Details: ref.Details})
}

// Runs returns the number of runs the proxy keeps.
func (s *Server) Runs() int { return s.agents.Runs() }

// retryCountHeader is the retry count the official OpenAI and Anthropic SDKs send:
// 0 on a first attempt, n on the n-th retry.
const retryCountHeader = "X-Stainless-Retry-Count"

// countRefusal counts a refusal by the request's class and its reason: the refusal's
// code, or for a budget's, its limit type.
func (ex *exchange) countRefusal(code, limitType string) {
	reason := code
	if code == "rate_limit_exceeded" {
		reason = limitType
	}
	ex.s.metrics.Agents.Refused(ex.agent.Class.String(), reason)
}

// countServed counts the tokens served to the request's key's team.
func (ex *exchange) countServed(input, output int64) {
	if ex.key == "" {
		return
	}
	if kp := ex.rt.policy.Key(ex.key); kp != nil && kp.Team != "" {
		ex.s.metrics.Agents.AddTeamUsage(kp.Team, input, output)
	}
}

// forgetTeams drops the usage series of teams no key of cfg names.
func (s *Server) forgetTeams(cfg *config.Config) {
	teams := map[string]bool{}
	for i := range cfg.APIKeys {
		teams[cfg.APIKeys[i].Team] = true
	}
	s.metrics.Agents.ForgetTeams(func(t string) bool { return teams[t] })
}
