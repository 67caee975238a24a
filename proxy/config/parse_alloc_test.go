// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	"runtime"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestParseAllocatesTheKeysOnce: a parse of 20,000 keys, YAML or rendered, allocates
// the list of keys once, with room for them and no more, not once per growth of a
// quarter: that came to about five times the list (920 bytes a key of 184, more than
// the rest of a rendered document's parse together) and kept up to a quarter unused.
func TestParseAllocatesTheKeysOnce(t *testing.T) {
	const keys = 20000
	yaml := largeDocument(keys)
	c, err := config.Parse(yaml)
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []struct {
		name string
		data []byte
		most uint64 // bytes a key; 0: not bounded (the YAML path's own conversion)
	}{{"rendered", rendered, 1000}, {"yaml", yaml, 0}} {
		var parsed *config.Config
		n := allocated(func() {
			if parsed, err = config.Parse(doc.data); err != nil {
				t.Fatal(err)
			}
		})
		if len(parsed.APIKeys) != keys || cap(parsed.APIKeys) != keys {
			t.Errorf("%s: %d keys in a list of room for %d, want %d", doc.name, len(parsed.APIKeys), cap(parsed.APIKeys), keys)
		}
		t.Logf("%s: the parse allocates %d bytes a key (the document: %d)", doc.name, n/keys, len(doc.data)/keys)
		if doc.most > 0 && n/keys > doc.most {
			t.Errorf("%s: the parse allocates %d bytes a key, want at most %d", doc.name, n/keys, doc.most)
		}
	}
}
