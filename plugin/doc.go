// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package plugin is `kubectl tokenwarden` (the binary kubectl-tokenwarden): what the
// people who run a fleet ask of it, read from the API server with the caller's own
// kubeconfig and RBAC. It is neither the operator (it writes nothing) nor the data
// plane (it serves no traffic), so it has a package of its own, one file per command:
// top.go (who uses how much of their tightest budget), status.go (what the fleet
// enforces and what needs a hand), and why.go, explain.go and spend.go, which this
// version registers as not available yet.
package plugin
