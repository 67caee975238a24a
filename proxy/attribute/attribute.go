// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package attribute holds the request attributes a client supplies in headers: the
// session, agent, task and run a request belongs to, their header names, and the
// bounds every reader of them applies (length, characters, several values, none).
package attribute

import (
	"fmt"
	"net/http"
)

// Header is one client-supplied attribute.
type Header uint8

// The client-supplied attributes.
const (
	// Session is the conversation or session a request belongs to.
	Session Header = iota
	// Agent is the agent (a program, a role) that sent it.
	Agent
	// Task is the task the agent works on.
	Task
	// Run is one run of an agent: what run budgets and step caps count.
	Run
	NumHeaders
)

// The header names, canonical as net/http writes them. Each value is the request's
// API key's own: the same id under another key is another session, agent, task or
// run, and a request without the header is in none (Absent).
const (
	SessionHeader = "X-Tokenwarden-Session-Id"
	AgentHeader   = "X-Tokenwarden-Agent-Id"
	TaskHeader    = "X-Tokenwarden-Task-Id"
	RunHeader     = "X-Tokenwarden-Run-Id"
)

// MaxLength is the longest value read, in bytes; a longer one is refused.
const MaxLength = 256

// Absent is the value of a request that sends no header, or an empty one: one
// value of its own under the key (the key's requests without a session are counted
// together, as one session).
const Absent = ""

var (
	headerNames = [NumHeaders]string{SessionHeader, AgentHeader, TaskHeader, RunHeader}
	words       = [NumHeaders]string{"session", "agent", "task", "run"}
)

// Name is the header's canonical name.
func (h Header) Name() string {
	if h < NumHeaders {
		return headerNames[h]
	}
	return ""
}

// String is the attribute's word in rules: session, agent, task or run.
func (h Header) String() string {
	if h < NumHeaders {
		return words[h]
	}
	return "unknown"
}

// Error is a header whose value is outside the bounds: the request is refused with
// 400, never counted as another value.
type Error struct {
	Header Header
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("the %s header %s", e.Header.Name(), e.Reason)
}

// Read returns the attribute's value in h: Absent when the header is missing or
// empty, an *Error when it is longer than MaxLength bytes, holds a byte that is not
// visible ASCII (0x21 to 0x7E: letters, digits and punctuation, no space or control
// character), or is sent more than once.
func Read(h http.Header, a Header) (string, error) {
	vs := h[a.Name()]
	switch len(vs) {
	case 0:
		return Absent, nil
	case 1:
	default:
		return "", &Error{Header: a, Reason: "is sent more than once: send one value"}
	}
	v := vs[0]
	if err := Check(v); err != "" {
		return "", &Error{Header: a, Reason: err}
	}
	return v, nil
}

// Check is why v is not a value of an attribute header ("" when it is one, or empty).
func Check(v string) string {
	if len(v) > MaxLength {
		return fmt.Sprintf("is longer than %d bytes", MaxLength)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x21 || c > 0x7e {
			return fmt.Sprintf("holds the byte 0x%02x at %d: a value is visible ASCII (letters, digits, punctuation), without spaces", c, i)
		}
	}
	return ""
}
