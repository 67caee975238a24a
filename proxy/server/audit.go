// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"encoding/json"
	"net/http"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
)

// AuditedRefusal is one refusal as /admin/refusals shows it (proxy/accesslog).
type AuditedRefusal = accesslog.AuditedRefusal

// KeyRefusals are one API key's last refusals, newest first (proxy/accesslog).
type KeyRefusals = accesslog.KeyRefusals

// Refusals returns the last refusals of the key named (every key's when name is
// empty and all is true), keys in name order.
func (s *Server) Refusals(name string, all bool) []KeyRefusals { return s.audit.Refusals(name, all) }

// refusalsHandler serves GET /admin/refusals: every key's last refusals, or with
// ?api_key=NAME one key's (?api_key= alone: the anonymous callers').
func (s *Server) refusalsHandler(w http.ResponseWriter, r *http.Request) {
	name, one := r.URL.Query()["api_key"]
	var key string
	if one && len(name) > 0 {
		key = name[0]
	}
	out := s.Refusals(key, !one)
	if one && len(out) == 0 {
		out = append(out, KeyRefusals{APIKey: key, Refusals: []AuditedRefusal{}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"api_keys": out})
}
