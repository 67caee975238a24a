// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"runtime"
	"testing"
)

// TestReloadAllocatesLittleGarbage: a replica's reload of 20,000 keys and 200 budgets
// (the whole of Apply) allocates at most 1,500 bytes a key, and the config in force
// keeps at most 760 of them after a collection (1,200 and 680 now). It allocated 2,740
// and kept 830: the list of keys grown a quarter at a time, the policy's map of keys
// and the list of allowances for the metrics grown, a fingerprint scope made for every
// key and dropped, and an entry for the scheduler kept for every key, which sets none.
func TestReloadAllocatesLittleGarbage(t *testing.T) {
	const keys, mostAllocated, mostKept = 20000, 1500, 760
	doc := fleetDoc(t, keys, 200, 1)
	srv, _ := reloadServer()
	live := liveHeap()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := srv.Apply(doc, "test"); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	kept := (liveHeap() - live) / keys
	runtime.KeepAlive(srv)
	runtime.KeepAlive(doc)
	allocated := (after.TotalAlloc - before.TotalAlloc) / keys
	t.Logf("the reload allocates %d bytes a key and keeps %d (the document: %d)", allocated, kept, len(doc)/keys)
	if allocated > mostAllocated {
		t.Errorf("the reload allocates %d bytes a key, want at most %d", allocated, mostAllocated)
	}
	if kept > mostKept {
		t.Errorf("the config in force keeps %d bytes a key, want at most %d", kept, mostKept)
	}
}

// TestReloadKeepsOneConfig: after a reload to the next generation, a replica keeps
// the config in force and nothing of the one before: at most 760 bytes a key of
// 20,000, as after its first (680 now). It kept 965: the first document whole, to tell
// which changes wait for a restart, a second copy of every key.
func TestReloadKeepsOneConfig(t *testing.T) {
	const keys, mostKept = 20000, 760
	srv, _ := reloadServer()
	first, next := fleetDoc(t, keys, 200, 1), fleetDoc(t, keys, 200, 2)
	live := liveHeap()
	for _, doc := range [][]byte{first, next} {
		if _, err := srv.Apply(doc, "test"); err != nil {
			t.Fatal(err)
		}
	}
	kept := (liveHeap() - live) / keys
	runtime.KeepAlive(srv)
	runtime.KeepAlive(first)
	runtime.KeepAlive(next)
	t.Logf("after the next generation the replica keeps %d bytes a key", kept)
	if kept > mostKept {
		t.Errorf("after the next generation the replica keeps %d bytes a key, want at most %d", kept, mostKept)
	}
}
