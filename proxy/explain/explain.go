// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package explain serves GET /admin/explain: every budget and rule that applies to
// one API key's requests for a model on a route, as the proxy's own resolver orders
// them for reservation (budget.Limiter.Explain), with each bucket's level now.
package explain

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/tokenwarden/tokenwarden/proxy/adminauth"
	"github.com/tokenwarden/tokenwarden/proxy/attribute"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// DefaultRoute is the route explained when the query names none.
const DefaultRoute = "/v1/chat/completions"

// Query is what to explain.
type Query struct {
	APIKey string
	Model  string
	// Route is a request path; DefaultRoute when empty.
	Route string
	// Upstream names the upstream that serves the request (its provider); empty: the
	// one the model's request goes to first.
	Upstream string
	// Session, Agent, Task and Run are the request's attribute headers (empty: not
	// sent), Fingerprint the hash of the request as forwarded (hex).
	Session, Agent, Task, Run, Fingerprint string
}

// attributeParams are the query's attribute parameters and their fields; each value
// is held to the attribute headers' bounds.
var attributeParams = [...]struct {
	name  string
	field func(*Query) *string
}{
	{"session", func(q *Query) *string { return &q.Session }},
	{"agent", func(q *Query) *string { return &q.Agent }},
	{"task", func(q *Query) *string { return &q.Task }},
	{"run", func(q *Query) *string { return &q.Run }},
	{"request_fingerprint", func(q *Query) *string { return &q.Fingerprint }},
}

// Answer is the endpoint's body.
type Answer struct {
	// Generation is the config generation explained.
	Generation int64 `json:"generation"`
	// Route is the route explained, as the proxy classifies it: a charged route, or
	// "other" (only request counts apply).
	Route string `json:"route"`
	// Attributes are the request's attributes beyond the key's: the serving
	// upstream's provider, the endpoint, the environment and those the query named.
	Attributes map[string]string `json:"attributes,omitempty"`
	budget.Explanation
}

// Errors a Func returns.
var (
	// ErrUnknownUpstream: no upstream of that name serves the model (400).
	ErrUnknownUpstream = errors.New("no upstream of that name serves the model")
	// ErrNoConfig: the proxy has no config yet (503).
	ErrNoConfig = errors.New("no configuration loaded yet")
	// ErrUnknownKey: no key of that name in the config in force (404).
	ErrUnknownKey = errors.New("no API key of that name in the config in force")
)

// Func explains a query by the config in force.
type Func func(ctx context.Context, q Query) (Answer, error)

// usage is the endpoint's query.
const usage = "GET /admin/explain?api_key=NAME[&model=M][&route=PATH][&upstream=NAME][&session=ID][&agent=ID][&task=ID][&run=ID][&request_fingerprint=HEX]"

// Handler serves GET /admin/explain (usage): a request of the key, with the
// attributes named, as the budgets see it (an attribute not named is not sent). A caller
// scoped to some tenants (adminauth.ScopeOf) is told only of their keys, and of the
// levels of the budgets it may read (the platform's with the fleet's namespace).
func Handler(explain Func) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.URL.Query()
		q := Query{APIKey: v.Get("api_key"), Model: v.Get("model"), Route: v.Get("route"), Upstream: v.Get("upstream")}
		if q.APIKey == "" {
			fail(w, http.StatusBadRequest, "api_key is required: "+usage)
			return
		}
		for _, p := range attributeParams {
			val := v.Get(p.name)
			if why := attribute.Check(val); why != "" {
				fail(w, http.StatusBadRequest, p.name+" "+why)
				return
			}
			*p.field(&q) = val
		}
		if q.Route == "" {
			q.Route = DefaultRoute
		}
		a, err := explain(r.Context(), q)
		sc := adminauth.ScopeOf(r.Context())
		if err == nil && !sc.Tenant(r.Context(), a.Tenant) {
			// A key of a tenant the caller may not read is as good as unknown.
			err = ErrUnknownKey
		}
		if err == nil && !sc.All() {
			a.Withhold(func(tenant string) bool { return sc.Tenant(r.Context(), tenant) })
		}
		switch {
		case errors.Is(err, ErrNoConfig):
			fail(w, http.StatusServiceUnavailable, err.Error())
			return
		case errors.Is(err, ErrUnknownUpstream):
			fail(w, http.StatusBadRequest, "no upstream named "+q.Upstream+" serves the model "+q.Model)
			return
		case errors.Is(err, ErrUnknownKey):
			fail(w, http.StatusNotFound, "no API key named "+q.APIKey+" in the config in force")
			return
		case err != nil:
			fail(w, http.StatusInternalServerError, err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(a)
	})
}

// fail answers an error as the admin API's other endpoints do: a plain line.
func fail(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, msg, code)
}
