// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package render turns what a fleet is made of (its TokenProxy, and the TokenBudgets
// and ApiKeys accepted into it) into the proxy's config document, compiles a budget
// into the proxy's rules and the summary its status shows, and lays a large document
// out in chunks (and the form in which the cache holds a chunk). Its functions read
// only their arguments: no client, no API server.
package render
