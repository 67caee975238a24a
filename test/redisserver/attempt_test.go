// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisserver

import (
	"strings"
	"testing"
)

// A cluster attempt that fails stops the servers it started and reports why, without
// failing the test; the next attempt starts afresh.
func TestAFailedClusterAttemptStopsItsServers(t *testing.T) {
	try := &attemptTB{TB: t}
	var started *Server
	_, err := try.run(func() *Cluster {
		started = Start(try)
		try.Fatalf("gossip did not converge")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "gossip did not converge") {
		t.Fatalf("the attempt's failure: got %v", err)
	}
	if !started.Running() {
		t.Fatal("the server stopped before the attempt was discarded")
	}
	try.discard()
	if started.Running() {
		t.Fatal("a discarded attempt left its server running")
	}
}

// A kept attempt's servers live until the test ends.
func TestAKeptClusterAttemptKeepsItsServers(t *testing.T) {
	var started *Server
	t.Run("attempt", func(t *testing.T) {
		try := &attemptTB{TB: t}
		if _, err := try.run(func() *Cluster { started = Start(try); return nil }); err != nil {
			t.Fatal(err)
		}
		try.keep()
		if !started.Running() {
			t.Fatal("a kept attempt's server stopped")
		}
	})
	if started.Running() {
		t.Fatal("a kept attempt's server outlived its test")
	}
}
