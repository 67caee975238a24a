// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/tokenwarden/tokenwarden/proxy/attribute"
)

// The attributes a rule selects on (applies_when) and counts by (count_by), beside
// the dimensions client, api_key, user, team, model and tenant.
const (
	// RuleProvider is the serving upstream: a selector matches its provider family
	// (openai, anthropic) or its name; count_by counts per upstream name.
	RuleProvider RuleDimension = "provider"
	// RuleEndpoint is the route family: chat_completions, completions, responses,
	// messages (every other path is other).
	RuleEndpoint RuleDimension = "endpoint"
	// RuleEnvironment is the key's environment, which the platform sets
	// (api_keys[].environment).
	RuleEnvironment RuleDimension = "environment"
	// RuleSession, RuleAgent, RuleTask and RuleRun are the client's headers
	// (package attribute), each counted under the key that sent it.
	RuleSession RuleDimension = "session"
	RuleAgent   RuleDimension = "agent"
	RuleTask    RuleDimension = "task"
	RuleRun     RuleDimension = "run"
	// RuleFingerprint is the SHA-256 of the request as forwarded, the response
	// cache's key: identical requests share it.
	RuleFingerprint RuleDimension = "request_fingerprint"
)

// ruleAttributes are the words of applies_when and count_by.
var ruleAttributes = []RuleDimension{
	RuleClient, RuleAPIKey, RuleUser, RuleTeam, RuleModel, RuleTenant,
	RuleProvider, RuleEndpoint, RuleEnvironment, RuleSession, RuleAgent, RuleTask, RuleRun, RuleFingerprint,
}

// Endpoints are the route families an endpoint selector names.
const (
	EndpointChatCompletions = "chat_completions"
	EndpointCompletions     = "completions"
	EndpointResponses       = "responses"
	EndpointMessages        = "messages"
	EndpointOther           = "other"
)

var endpoints = []string{EndpointChatCompletions, EndpointCompletions, EndpointResponses, EndpointMessages, EndpointOther}

// ClientSupplied reports whether the client chooses the attribute's value (its
// headers, or its body for the fingerprint): such a value is always counted under the
// key that sent it, and its distinct values are bounded (max_attribute_values).
func (d RuleDimension) ClientSupplied() bool {
	switch d {
	case RuleSession, RuleAgent, RuleTask, RuleRun, RuleFingerprint:
		return true
	}
	return false
}

// canonicalAttribute is canonicalDimension for an attribute word ("Session",
// "RequestFingerprint" for session, request_fingerprint).
func canonicalAttribute(d RuleDimension) RuleDimension {
	if c := canonicalWord(d, ruleAttributes); slices.Contains(ruleAttributes, c) {
		return c
	}
	return canonicalDimension(d)
}

// defaultSelector spells applies_when's attributes and endpoint words the proxy's way.
func (r *Rule) defaultSelector() {
	if len(r.AppliesWhen) == 0 {
		return
	}
	out := make(map[RuleDimension][]string, len(r.AppliesWhen))
	for a, vs := range r.AppliesWhen {
		c := canonicalAttribute(a)
		if _, dup := out[c]; dup {
			c = a // two spellings of one attribute: Validate names the second
		}
		if c == RuleEndpoint {
			vs = slices.Clone(vs)
			for i := range vs {
				vs[i] = canonicalWord(vs[i], endpoints)
			}
		}
		out[c] = vs
	}
	r.AppliesWhen = out
}

// validateSelector checks applies_when: known attributes, each with values, and no
// model selector beside models.
func (r *Rule) validateSelector(errs *fieldErrors, f string) {
	for _, a := range slices.Sorted(maps.Keys(r.AppliesWhen)) {
		vs := r.AppliesWhen[a]
		fa := f + ".applies_when." + string(a)
		if !slices.Contains(ruleAttributes, a) {
			errs.add(fa, "unknown attribute: must be one of %s", joinWords(ruleAttributes))
			continue
		}
		if len(vs) == 0 {
			errs.add(fa, "must list at least one value")
		}
		if a == RuleModel && len(r.Models) > 0 {
			errs.add(fa, "models already selects the models: write them in one place")
		}
		for j, v := range vs {
			fv := fmt.Sprintf("%s[%d]", fa, j)
			switch {
			case v == "":
				errs.add(fv, "must not be empty")
			case a == RuleEndpoint && !slices.Contains(endpoints, v):
				errs.add(fv, "unknown endpoint %q: must be one of %s", v, strings.Join(endpoints, ", "))
			case a.ClientSupplied() && a != RuleFingerprint && attribute.Check(v) != "":
				errs.add(fv, "no request can send it: a value %s", attribute.Check(v))
			}
		}
	}
}

func joinWords(ws []RuleDimension) string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = string(w)
	}
	return strings.Join(out, ", ")
}
