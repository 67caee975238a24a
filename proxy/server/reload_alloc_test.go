// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"runtime"
	"testing"
)

// TestReloadAllocatesLittleGarbage: a replica's reload of 20,000 keys and 200 budgets
// (the whole of Apply) allocates at most 2,000 bytes a key, of which the config in
// force keeps about 800 (BenchmarkReload50k: 38 MiB at 50,000 keys). It allocated 2,700:
// the list of keys grown a quarter at a time, the policy's map of keys and the list of
// allowances for the metrics grown, a fingerprint scope made for every key and dropped.
func TestReloadAllocatesLittleGarbage(t *testing.T) {
	const keys, most = 20000, 2000
	doc := fleetDoc(t, keys, 200, 1)
	srv, _ := reloadServer()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := srv.Apply(doc, "test"); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	perKey := (after.TotalAlloc - before.TotalAlloc) / keys
	t.Logf("the reload allocates %d bytes a key (the document: %d)", perKey, len(doc)/keys)
	if perKey > most {
		t.Errorf("the reload allocates %d bytes a key, want at most %d", perKey, most)
	}
}
