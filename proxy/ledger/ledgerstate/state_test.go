// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledgerstate

import (
	"testing"
	"time"
)

// TestParse reads back what Encode writes, and nothing from an absent or broken
// annotation.
func TestParse(t *testing.T) {
	oldest := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	in := State{Spooling: true, SpoolBatches: 3, SpoolBytes: 4096, Oldest: &oldest, ExpiredBatches: 2}
	got, ok := Parse(in.Encode())
	if !ok || !got.Spooling || got.SpoolBatches != 3 || got.SpoolBytes != 4096 || !got.Oldest.Equal(oldest) || got.ExpiredBatches != 2 {
		t.Fatalf("Parse(Encode) = %+v, %v; want %+v", got, ok, in)
	}
	for _, v := range []string{"", "{", `{"spool_batches":"x"}`} {
		if _, ok := Parse(v); ok {
			t.Errorf("Parse(%q) parsed", v)
		}
	}
}
