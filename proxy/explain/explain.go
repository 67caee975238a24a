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
}

// Answer is the endpoint's body.
type Answer struct {
	// Generation is the config generation explained.
	Generation int64 `json:"generation"`
	// Route is the route explained, as the proxy classifies it: a charged route, or
	// "other" (only request counts apply).
	Route string `json:"route"`
	budget.Explanation
}

// Errors a Func returns.
var (
	// ErrNoConfig: the proxy has no config yet (503).
	ErrNoConfig = errors.New("no configuration loaded yet")
	// ErrUnknownKey: no key of that name in the config in force (404).
	ErrUnknownKey = errors.New("no API key of that name in the config in force")
)

// Func explains a query by the config in force.
type Func func(ctx context.Context, q Query) (Answer, error)

// Handler serves GET /admin/explain?api_key=NAME[&model=M][&route=PATH]. A caller
// scoped to some tenants (adminauth.ScopeOf) is told only of their keys, and of the
// levels of the budgets it may read (the platform's with the fleet's namespace).
func Handler(explain Func) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.URL.Query()
		q := Query{APIKey: v.Get("api_key"), Model: v.Get("model"), Route: v.Get("route")}
		if q.APIKey == "" {
			fail(w, http.StatusBadRequest, "api_key is required: GET /admin/explain?api_key=NAME[&model=M][&route=PATH]")
			return
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
