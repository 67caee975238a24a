// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"slices"
	"strings"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// EnvironmentLabel is the label of a namespace that names its keys' environment
// (production, staging): the platform sets it, never a tenant, since a tenant does
// not write its Namespace object.
const EnvironmentLabel = "tokenwarden.io/environment"

var attributeWords = map[twv1alpha1.CountBy]config.RuleDimension{
	twv1alpha1.CountByAPIKey: config.RuleAPIKey, twv1alpha1.CountByUser: config.RuleUser, twv1alpha1.CountByTeam: config.RuleTeam,
	twv1alpha1.CountByModel: config.RuleModel, twv1alpha1.CountByClient: config.RuleClient,
	twv1alpha1.CountByTenant: config.RuleTenant, twv1alpha1.CountByProvider: config.RuleProvider,
	twv1alpha1.CountByEndpoint: config.RuleEndpoint, twv1alpha1.CountByEnvironment: config.RuleEnvironment,
	twv1alpha1.CountBySession: config.RuleSession, twv1alpha1.CountByAgent: config.RuleAgent,
	twv1alpha1.CountByTask: config.RuleTask, twv1alpha1.CountByRun: config.RuleRun,
	twv1alpha1.CountByRequestFingerprint: config.RuleFingerprint,
}

var endpointWords = map[string]string{
	"ChatCompletions": config.EndpointChatCompletions, "Completions": config.EndpointCompletions,
	"Responses": config.EndpointResponses, "Messages": config.EndpointMessages, "Other": config.EndpointOther,
}

// appliesWhen renders a budget's selectors in the proxy's words. A tenant's team,
// user and key values are its own, qualified as its subjects are.
func appliesWhen(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget) map[config.RuleDimension][]string {
	if len(b.Spec.AppliesWhen) == 0 {
		return nil
	}
	out := make(map[config.RuleDimension][]string, len(b.Spec.AppliesWhen))
	for _, sel := range b.Spec.AppliesWhen {
		a := attributeWords[sel.Attribute]
		out[a] = qualifyValues(tp, b, a, sel.Values)
	}
	return out
}

// qualifyValues are a selector's values as the config names them.
func qualifyValues(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget, a config.RuleDimension, values []string) []string {
	out := slices.Clone(values)
	tenant := ""
	if Scoped(tp, b) {
		tenant = b.Namespace
	}
	for i, v := range out {
		switch {
		case a == config.RuleEndpoint:
			if w, ok := endpointWords[v]; ok {
				out[i] = w
			}
		case a == config.RuleProvider && (strings.EqualFold(v, string(config.ProviderOpenAI)) || strings.EqualFold(v, string(config.ProviderAnthropic))):
			out[i] = strings.ToLower(v)
		case a == config.RuleAPIKey:
			out[i] = keySubject(b, tenant, v)
		case (a == config.RuleTeam || a == config.RuleUser) && tenant != "":
			out[i] = qualifiedSubject(tenant, v)
		}
	}
	return out
}

// keySubject is an ApiKey subject's name in the config: a key of the fleet's
// namespace is its name there (namespace/name works too), a key of another
// namespace namespace_name; a tenant's key named name is its own namespace's.
func keySubject(b *twv1alpha1.TokenBudget, tenant, subj string) string {
	if tenant != "" {
		if !strings.Contains(subj, "/") {
			subj = tenant + "/" + subj
		}
		return strings.Replace(subj, "/", "_", 1)
	}
	return strings.Replace(strings.TrimPrefix(subj, ProxyOf(b).Namespace+"/"), "/", "_", 1)
}

// AppliesWhenText is a budget's selectors in words, for kubectl get:
// "endpoint=chat_completions agent=planner,coder".
func AppliesWhenText(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget) string {
	var parts []string
	for _, sel := range b.Spec.AppliesWhen {
		a := attributeWords[sel.Attribute]
		parts = append(parts, string(a)+"="+strings.Join(qualifyValues(tp, b, a, sel.Values), ","))
	}
	return strings.Join(parts, " ")
}

// CountByText is what a budget fans out by, in the proxy's word: "session".
func CountByText(b *twv1alpha1.TokenBudget) string { return string(attributeWords[b.Spec.CountBy]) }

// selects reports whether a budget selects on an attribute.
func selects(b *twv1alpha1.TokenBudget, a twv1alpha1.CountBy) bool {
	return slices.ContainsFunc(b.Spec.AppliesWhen, func(s twv1alpha1.AttributeSelector) bool { return s.Attribute == a })
}
