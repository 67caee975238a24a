// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/cache"
)

// maxPurgeBody bounds the body of POST /admin/cache/purge.
const maxPurgeBody = 4 << 10

// CachePurge is the body of POST /admin/cache/purge: the entries of a scope (an API
// key's, a team's, or the fleet's, as the cache's scope names them), of a model, of
// both, or every entry when All is set. A body that names nothing purges nothing.
type CachePurge struct {
	APIKey string `json:"api_key,omitempty"`
	Team   string `json:"team,omitempty"`
	Fleet  bool   `json:"fleet,omitempty"`
	Model  string `json:"model,omitempty"`
	All    bool   `json:"all,omitempty"`
}

// CachePurged is the answer of POST /admin/cache/purge.
type CachePurged struct {
	// Purged is how many entries the store dropped: this replica's own for a memory
	// store, every replica's for a Redis store.
	Purged int `json:"purged"`
	// Storage is the store purged: memory or redis.
	Storage string `json:"storage"`
}

// match is the store's Match for p, or what is wrong with p.
func (p CachePurge) match() (cache.Match, error) {
	var m cache.Match
	n := 0
	if p.APIKey != "" {
		m.Scope, n = "key:"+p.APIKey, n+1
	}
	if p.Team != "" {
		m.Scope, n = "team:"+p.Team, n+1
	}
	if p.Fleet {
		m.Scope, n = "fleet", n+1
	}
	switch {
	case n > 1:
		return m, fmt.Errorf("name one scope of api_key, team and fleet")
	case p.All && (n > 0 || p.Model != ""):
		return m, fmt.Errorf("all: purges every entry; name no scope or model with it")
	case !p.All && n == 0 && p.Model == "":
		return m, fmt.Errorf("name a scope (api_key, team or fleet), a model, or all: true")
	}
	m.Model = p.Model
	return m, nil
}

// cachePurge serves POST /admin/cache/purge: it drops the stored answers a CachePurge
// selects.
func (s *Server) cachePurge(w http.ResponseWriter, r *http.Request) {
	room := s.cache.Load()
	if room == nil || room.store == nil {
		http.Error(w, "this proxy stores no answers (cache.storage is not set)", http.StatusConflict)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPurgeBody+1))
	if err != nil || len(body) > maxPurgeBody {
		http.Error(w, fmt.Sprintf("the body could not be read, or is larger than %d bytes", maxPurgeBody), http.StatusBadRequest)
		return
	}
	var p CachePurge
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		http.Error(w, "the body is not a purge: "+err.Error(), http.StatusBadRequest)
		return
	}
	m, err := p.match()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	n, err := room.store.Purge(ctx, m)
	if err != nil {
		s.log.Error("The response cache's purge failed", "scope", m.Scope, "model", m.Model, "purged", n, "error", err)
		http.Error(w, fmt.Sprintf("the purge failed after %d entries: %v", n, err), http.StatusServiceUnavailable)
		return
	}
	s.log.Info("Purged the response cache", "scope", m.Scope, "model", m.Model, "purged", n)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(CachePurged{Purged: n, Storage: room.cfg.Storage})
}
