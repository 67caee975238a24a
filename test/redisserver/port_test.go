// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisserver

import (
	"errors"
	"testing"
)

// A port is free when the helper chooses it, but another process may take it before
// the server binds it. The server that answers on it must then not be taken for the
// one started (it answers PING too): the start reports the port taken, and Start
// tries another.
func TestStartOnATakenPort(t *testing.T) {
	other := Start(t)
	s := &Server{port: other.port, dir: t.TempDir()}
	if err := s.start(); !errors.Is(err, errPortTaken) {
		t.Fatalf("a start on the port of a running server: got %v, want the port taken", err)
	}
}
