// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"encoding/hex"
	"errors"
	"net/http"

	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/cache"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// codeBadAttribute is the refusal of a request whose attribute header is out of bounds.
const codeBadAttribute = "invalid_request_attribute"

// headerAttrs are the client's header attributes, with the identity's field each fills.
var headerAttrs = [...]struct {
	attr budget.Attr
	hdr  attribute.Header
	into func(*budget.Identity) *string
}{
	{budget.AttrSession, attribute.Session, func(id *budget.Identity) *string { return &id.Session }},
	{budget.AttrAgent, attribute.Agent, func(id *budget.Identity) *string { return &id.Agent }},
	{budget.AttrTask, attribute.Task, func(id *budget.Identity) *string { return &id.Task }},
	{budget.AttrRun, attribute.Run, func(id *budget.Identity) *string { return &id.Run }},
}

// attributes fills in the request's attributes beyond the dimensions: the serving
// upstream and the route family always, the headers and the fingerprint when a rule
// reads them. A header out of bounds is refused with 400, never counted as a value.
func (ex *exchange) attributes(id *budget.Identity) bool {
	if up := ex.upstream; up != nil {
		id.Upstream, id.Provider = providerOf(up, ex.route.family)
	}
	id.Endpoint = ex.route.endpoint
	reads := ex.rt.policy.Reads()
	if reads == 0 {
		return true
	}
	for _, h := range headerAttrs {
		if !reads.Has(h.attr) {
			continue
		}
		v, err := attribute.Read(ex.r.Header, h.hdr)
		var ae *attribute.Error
		if errors.As(err, &ae) {
			return ex.fail(http.StatusBadRequest, codeBadAttribute, err.Error(), nil)
		}
		*h.into(id) = v
	}
	if reads.Has(budget.AttrFingerprint) {
		id.Fingerprint = ex.fingerprint()
	}
	return true
}

// providerOf is an upstream's name and provider family: its own, or the API family
// of the route when it names none.
func providerOf(up *upstream.Upstream, f refusal.Family) (name, provider string) {
	provider = string(up.Provider)
	if provider == "" {
		provider = string(config.ProviderOpenAI)
		if f == refusal.Anthropic {
			provider = string(config.ProviderAnthropic)
		}
	}
	return up.Name, provider
}

// fingerprint is the hash of the request as forwarded, as the response cache keys it
// under its API key's scope: the cache's own key when the cache keyed it so.
func (ex *exchange) fingerprint() string {
	scope, ok := ex.rt.fingerprintScopes[ex.key]
	if !ok {
		scope = "anonymous"
	}
	if cs := &ex.cache; cs.keyed && cs.key.Scope == scope {
		return hex.EncodeToString(cs.key.Hash[:])
	}
	body := ex.body
	if ex.try.Body != nil {
		body = ex.try.Body
	}
	var upName string
	if ex.upstream != nil {
		upName = ex.upstream.Name
	}
	k := (&cache.Request{
		Scope: scope, Route: ex.route.name, Upstream: upName, Model: ex.est.Model,
		Query: ex.r.URL.RawQuery, Header: ex.r.Header, Body: body,
	}).Key()
	return hex.EncodeToString(k.Hash[:])
}
