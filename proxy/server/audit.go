// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import "github.com/tokenwarden/tokenwarden/proxy/accesslog"

// AuditedRefusal is one refusal as /admin/refusals shows it (proxy/accesslog).
type AuditedRefusal = accesslog.AuditedRefusal

// KeyRefusals are one API key's last refusals, newest first (proxy/accesslog).
type KeyRefusals = accesslog.KeyRefusals

// Refusals returns the last refusals of the key named (every key's when name is
// empty and all is true), keys in name order.
func (s *Server) Refusals(name string, all bool) []KeyRefusals { return s.audit.Refusals(name, all) }
