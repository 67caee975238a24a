// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// lease is a replica's report Lease renewed at renewed for 30 s, with its ledger's state.
func lease(name, ledger string, renewed time.Time) coordinationv1.Lease {
	return coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{twv1alpha1.ReplicaLedgerAnnotation: ledger}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](30),
			RenewTime: &metav1.MicroTime{Time: renewed}},
	}
}

// A full spool and the batches it lost are told replica by replica; a replica that
// flushes again after losing some still says what was lost; a dead replica's report
// is not read.
func TestLedgerNotes(t *testing.T) {
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	leases := []coordinationv1.Lease{
		lease("p-b", `{"spooling":true,"full":true,"spool_batches":4096,"spool_bytes":67108864,"oldest":"2026-11-30T06:10:00Z",`+
			`"flushed_through":"2026-11-30T06:09:58Z","dropped_batches":31,"dropped_rows":62,"dropped_requests":1240,"dropped_cost_micro_usd":496000}`, now),
		lease("p-a", `{"spool_batches":0,"spool_bytes":0,"flushed_through":"2026-11-30T07:59:58Z","expired_batches":2,"expired_requests":8,"expired_cost_micro_usd":3200}`, now),
		lease("p-dead", `{"spooling":true,"spool_batches":1,"spool_bytes":10}`, now.Add(-time.Minute)),
	}
	f := FleetStatus{Ledger: ledgerReach(leases, nil, now)}
	if got := ledgerColumn(f); got != "1/2" {
		t.Errorf("LEDGER is %q, want 1/2 (p-a of the two live replicas)", got)
	}
	if got := lastFlush(f); got != "2026-11-30T06:09:58Z" {
		t.Errorf("RECORDED THROUGH is %q, want the full replica's last flush", got)
	}
	want := []string{
		"Ledger: p-a writes to the ledger database; recorded through 2026-11-30T07:59:58Z; 2 batches never recorded (0 dropped with the spool full, 2 expired): 8 requests, $0.003200.",
		"Ledger: p-b cannot write to the ledger database: 4096 batches (64Mi) wait in its spool, the oldest from 2026-11-30T06:10:00Z, " +
			"and the spool is full; recorded through 2026-11-30T06:09:58Z; 31 batches never recorded (31 dropped with the spool full, 0 expired): 1240 requests, $0.496000.",
	}
	if got := ledgerNotes(f.Ledger); !slices.Equal(got, want) {
		t.Errorf("ledger notes:\n%q\nwant\n%q", got, want)
	}
}

// A fleet has a ledger when its spec asks for one or the operator reports on it
// (the operator's default ledger); a disabled one has none.
func TestHasLedger(t *testing.T) {
	spooling := []metav1.Condition{{Type: twv1alpha1.ConditionLedgerSpooling, Status: metav1.ConditionFalse, Reason: twv1alpha1.ReasonFlushed}}
	for _, c := range []struct {
		name string
		tp   twv1alpha1.TokenProxy
		want bool
	}{
		{"none", twv1alpha1.TokenProxy{}, false},
		{"spec", twv1alpha1.TokenProxy{Spec: twv1alpha1.TokenProxySpec{Ledger: &twv1alpha1.LedgerSpec{}}}, true},
		{"default", twv1alpha1.TokenProxy{Status: twv1alpha1.TokenProxyStatus{Conditions: spooling}}, true},
		{"disabled", twv1alpha1.TokenProxy{Spec: twv1alpha1.TokenProxySpec{Ledger: &twv1alpha1.LedgerSpec{Disabled: true}}}, false},
	} {
		if got := hasLedger(&c.tp); got != c.want {
			t.Errorf("%s: hasLedger is %t, want %t", c.name, got, c.want)
		}
	}
}
