// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package cache answers a request without a backend call: from a stored answer (a
// memory or Redis store, keyed by what makes an answer the same) or from an identical
// request in flight (a coalescing group whose leader's answer fans out to its waiters).
package cache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Key identifies the answers that are the same: the SHA-256 of a Request, with the
// scope and serving model it hashes, which a purge selects by.
type Key struct {
	Hash  [sha256.Size]byte
	Scope string
	Model string
}

// String is the hash in lowercase hex.
func (k Key) String() string { return hex.EncodeToString(k.Hash[:]) }

// VaryHeaders are the request headers that change an upstream's answer, and so are
// part of the key: the API version and beta features each provider reads, the
// organization and project an OpenAI call is billed to (which decide the models and
// fine-tunes it may reach), and what the client accepts. Every other header (the
// credential, which the scope stands for; SDK metadata; tracing) leaves the key as is.
// Each is in canonical form, as the key reads them from the header map directly.
var VaryHeaders = []string{
	"Accept",
	"Anthropic-Beta",
	"Anthropic-Version",
	"Openai-Beta",
	"Openai-Organization",
	"Openai-Project",
}

// Request is what a key is made of. Body is the body as forwarded: decoded (a gzip
// and a plain body of the same request are one body), after every rewrite the proxy
// makes (a class's output cap, the provider's model name).
type Request struct {
	// Scope is whose answers these are (ScopeFor).
	Scope string
	// Route is the charged route ("/v1/chat/completions").
	Route string
	// Upstream is the name of the upstream that serves it.
	Upstream string
	// Model is the model it is asked for; with Upstream, the serving model.
	Model string
	// Query is the request's raw query string.
	Query string
	// Header is the request's headers; only VaryHeaders are read.
	Header http.Header
	// Body is the decoded body as forwarded.
	Body []byte
}

// Key hashes the request. Every part is length-prefixed, so no two different
// requests concatenate to the same input.
func (r *Request) Key() Key {
	h := sha256.New()
	// The short parts go in one write, the body in another.
	b := make([]byte, 0, 256)
	b = field(b, "v1") // the key's own version: a change of its parts changes every key
	b = field(b, r.Scope)
	b = field(b, r.Route)
	b = field(b, r.Upstream)
	b = field(b, r.Model)
	b = field(b, canonicalQuery(r.Query))
	for _, name := range VaryHeaders {
		b = field(b, headerValue(r.Header, name))
	}
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	h.Write(b)
	h.Write(r.Body)
	k := Key{Scope: r.Scope, Model: r.Model}
	h.Sum(k.Hash[:0])
	return k
}

// headerFirst is h.Get(name) for a canonical name, without canonicalizing it again.
func headerFirst(h http.Header, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// field appends s, length-prefixed.
func field(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// canonicalQuery orders the query's parameters by name (each name's values keep
// their order), so that ?a=1&b=2 and ?b=2&a=1 are one key. A query that does not
// parse is kept as sent.
func canonicalQuery(q string) string {
	if q == "" {
		return ""
	}
	v, err := url.ParseQuery(q)
	if err != nil {
		return "\x00" + q
	}
	return v.Encode()
}

// headerValue is a header's values as one comma-separated list with the spaces
// around each element trimmed: two lines and one line of the same list are one
// value. Absent and empty differ ("\x00" marks absent), as an upstream may read them
// differently.
func headerValue(h http.Header, name string) string {
	vs := h[name] // name is canonical, as every name of VaryHeaders
	if len(vs) == 0 {
		return "\x00"
	}
	if len(vs) == 1 && !strings.ContainsAny(vs[0], ", \t") {
		return vs[0]
	}
	var parts []string
	for _, v := range vs {
		for p := range strings.SplitSeq(v, ",") {
			parts = append(parts, strings.TrimSpace(p))
		}
	}
	parts = slices.DeleteFunc(parts, func(p string) bool { return p == "" })
	return strings.Join(parts, ",")
}

// Scopes: whose answers a hit may serve.
const (
	// ScopeAPIKey serves an answer only to the API key that caused it (the default).
	ScopeAPIKey = config.CacheScopeAPIKey
	// ScopeTeam serves it to every key of the same team.
	ScopeTeam = config.CacheScopeTeam
	// ScopeFleet serves it to every caller of the fleet.
	ScopeFleet = config.CacheScopeFleet
)

// ScopeFor is the scope string of a caller under a scope setting: the key's name,
// its team (tenant-qualified by whoever names it), or the fleet. It reports false when
// the caller has no such scope (an anonymous caller under api_key, a key without a
// team under team): its answers are neither looked up nor stored.
func ScopeFor(scope, keyName, team string) (string, bool) {
	switch scope {
	case ScopeFleet:
		return "fleet", true
	case ScopeTeam:
		if team == "" {
			return "", false
		}
		return "team:" + team, true
	default:
		if keyName == "" {
			return "", false
		}
		return "key:" + keyName, true
	}
}
