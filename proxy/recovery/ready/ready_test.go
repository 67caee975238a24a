// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ready

import (
	"strings"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

func TestOrder(t *testing.T) {
	lossAt := time.UnixMilli(1_796_000_000_000)
	past := lossAt.Add(time.Minute)
	lost := "1795999000000-aa"
	fenced := func(found string) []budget.GroupEpoch {
		return []budget.GroupEpoch{{Group: "g", Epoch: lost, Fenced: true, Found: found, FencedAt: lossAt.UnixMilli()}}
	}
	trusted := []budget.GroupEpoch{{Group: "g", Epoch: lost}}
	for _, tc := range []struct {
		name string
		live []Replica
		want string // the reason's start; "" for an order
	}{
		{"every ledger past the loss and the grace", []Replica{
			{Name: "a", Epochs: fenced(""), Ledger: true, FlushedThrough: past},
			{Name: "b", Epochs: trusted, Ledger: true, FlushedThrough: past.Add(time.Second)}}, ""},
		{"an older epoch in the store is lost state too", []Replica{
			{Name: "a", Epochs: fenced("1700000000000-bb"), Ledger: true, FlushedThrough: past}}, ""},
		{"a newer epoch in the store is an attestation", []Replica{
			{Name: "a", Epochs: fenced("1796000000001-cc"), Ledger: true, FlushedThrough: past}}, NoLoss},
		{"nothing lost", []Replica{{Name: "a", Epochs: trusted, Ledger: true, FlushedThrough: past}}, NoLoss},
		{"a replica not fenced yet, still behind", []Replica{
			{Name: "a", Epochs: fenced(""), Ledger: true, FlushedThrough: past},
			{Name: "b", Epochs: trusted, Ledger: true, FlushedThrough: lossAt.Add(time.Second)}}, "replica b has flushed its ledger only through"},
		{"a replica that never flushed", []Replica{
			{Name: "a", Epochs: fenced(""), Ledger: true}}, "replica a has flushed its ledger only through never"},
		{"a replica without a ledger", []Replica{
			{Name: "a", Epochs: fenced(""), Ledger: true, FlushedThrough: past}, {Name: "b", Epochs: trusted}}, "replica b reports no spend ledger"},
		{"a store check's fence", []Replica{
			{Name: "a", Epochs: fenced(""), Ledger: true, FlushedThrough: past},
			{Name: "b", Epochs: []budget.GroupEpoch{{Group: "g", Epoch: lost, StoreFence: "evictions: 3"}}, Ledger: true, FlushedThrough: past}},
			"replica b is fenced by a store check"},
		{"no fence time", []Replica{
			{Name: "a", Epochs: []budget.GroupEpoch{{Group: "g", Epoch: lost, Fenced: true}}, Ledger: true, FlushedThrough: past}},
			"replica a reports no time for its fence"},
		{"two epochs", []Replica{
			{Name: "a", Epochs: fenced(""), Ledger: true, FlushedThrough: past},
			{Name: "b", Epochs: []budget.GroupEpoch{{Group: "g", Epoch: "1795999000001-dd", Fenced: true, FencedAt: lossAt.UnixMilli()}}, Ledger: true, FlushedThrough: past}},
			"the replicas run under different epochs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, why := Order(tc.live, InFlightGrace)
			switch {
			case tc.want == "" && o == nil:
				t.Fatalf("no order: %s", why)
			case tc.want == "" && (o.Epoch != lost || o.FlushedThroughMillis != past.UnixMilli()):
				t.Fatalf("order %+v, want epoch %s through %d (the least)", o, lost, past.UnixMilli())
			case tc.want != "" && (o != nil || !strings.HasPrefix(why, tc.want)):
				t.Fatalf("order %+v, reason %q; want none, for %q", o, why, tc.want)
			}
		})
	}
}
