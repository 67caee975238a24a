// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// agentLimits applies the limits for agents (proxy/agentlimit) before budget
// admission, so that a request they refuse takes no reservation: the class's output
// cap (which may rewrite the body and its estimate), the key's in-flight generations,
// and its run's budget and steps. A retry the client's SDK says it makes is counted.
func (s *Server) agentLimits(ex *exchange) bool {
	r, key := ex.r, ex.key
	if rc := r.Header.Get(retryCountHeader); rc != "" && rc != "0" {
		s.metrics.Agents.Retried(ex.route.name)
	}
	c := schedule.Interactive
	if key != nil {
		c = ex.rt.sched(key.Name).class
	}
	ex.agent.Class = agentlimit.ClassOf(r.Header, c)
	if ex.route.charged && ex.body != nil && !ex.capOutput() {
		return false
	}
	// The cache is read on the body as forwarded; a hit holds no slot in flight.
	ex.agent.Answered = s.cachePeek(ex)
	if key == nil {
		return true
	}
	ks := ex.rt.sched(key.Name)
	if ref := s.agents.Admit(&ex.agent, s.clock, r.Header, key.Name, ks.limits, ex.est.Total()); ref != nil {
		return ex.refuseAgent(ref)
	}
	return true
}

// capOutput applies the class's output cap to a charged request; a changed body is
// forwarded plain, with the estimate the rewrite made (a tokenizer's count stands).
func (ex *exchange) capOutput() bool {
	out, est, ref := agentlimit.CapOutput(ex.rt.classLimits[ex.agent.Class], ex.agent.Class, ex.route.name, ex.body, ex.est)
	if ref != nil {
		return ex.refuseAgent(ref)
	}
	if out != nil {
		ex.setBody(out, est)
	}
	return true
}

// setBody makes out, a rewrite of the body's output limits, the body forwarded, with
// est its estimate.
func (ex *exchange) setBody(out []byte, est estimate.Estimate) {
	ex.est, ex.body = est, out
	if ex.try.Body != nil {
		// An attempt under a provider's model name is rewritten from this body.
		ex.try.Body = out
	}
	agentlimit.SetBody(ex.r, out)
}

// refuseAgent answers a refusal of the limits for agents in the route's shape.
func (ex *exchange) refuseAgent(ref *agentlimit.Refusal) bool {
	if ref.Header != "" {
		ex.w.Header().Set(ref.Header, ref.Value)
	}
	return ex.fail(ref.Status, ref.Code, ref.Message, &refusal.Body{LimitType: ref.LimitType, Details: ref.Details})
}

// Runs returns the number of runs the proxy keeps.
func (s *Server) Runs() int { return s.agents.Runs() }

// retryCountHeader is the retry count the official OpenAI and Anthropic SDKs send:
// 0 on a first attempt, n on the n-th retry.
const retryCountHeader = "X-Stainless-Retry-Count"

// forgetTeams drops the usage series of teams no key of cfg names.
func (s *Server) forgetTeams(cfg *config.Config) {
	teams := map[string]bool{}
	for i := range cfg.APIKeys {
		teams[cfg.APIKeys[i].Team] = true
	}
	s.metrics.Agents.ForgetTeams(func(t string) bool { return teams[t] })
}
