// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgerstate"
)

// The data plane's report: each proxy replica renews a Lease labelled with the
// ConfigMap it serves, annotated with the generation and digest of the config it has
// applied (proxy/report). The renewed Leases are the fleet's live replicas: there is
// no kubelet in envtest or in the demo's process fleet, and a pod that runs is not a
// proxy that has loaded anything.

// replicaReport is one live replica as its Lease tells it.
type replicaReport struct {
	name string
	// generation is what the replica is counted as having loaded: the generation it
	// reports, or one less when it reports the current generation with a document
	// other than the one the operator wrote (a hand-edited ConfigMap, for example).
	generation int64
	// otherDoc is true in that case.
	otherDoc bool
	expires  time.Time
	// epochs are the durable counters' epochs the replica runs under
	// (ReplicaDurableEpochsAnnotation).
	epochs []reportedEpoch
	// health is the model registry's upstreams' health (tokenproxy_status_upstreams.go).
	health []reportedHealth
	// ledger is the replica's ledger (tokenproxy_status_ledger.go); nil without one.
	ledger *ledgerstate.State
}

// loadedWhat says what the replica has loaded, for a condition's message.
func (rr *replicaReport) loadedWhat() string {
	if rr.otherDoc {
		return fmt.Sprintf("has loaded a document other than the operator's as generation %d", rr.generation+1)
	}
	return fmt.Sprintf("has loaded generation %d", rr.generation)
}

// reports are a fleet's live replicas, by name.
type reports struct {
	live []replicaReport
	// next is the earliest expiry of a live Lease: the reconcile to come then drops it
	// if it was not renewed. Zero without live replicas.
	next time.Time
	// ledgerWait: a group's lost counters wait for the replicas' ledgers to be
	// flushed past the loss, which their Leases do not wake the reconciler for.
	ledgerWait bool
}

// loaded returns the number of live replicas that have loaded generation g or a later
// one, and the first (by name) that has not.
func (rs *reports) loaded(g int64) (n int32, behind *replicaReport) {
	for i := range rs.live {
		if rs.live[i].generation >= g {
			n++
		} else if behind == nil {
			behind = &rs.live[i]
		}
	}
	return n, behind
}

// readReports reads the fleet's Leases: the live ones are the replica set; expired
// ones are deleted (a replica that comes back recreates its Lease). s.cfg holds the
// generation and digest of the document in the fleet's ConfigMap.
func (r *TokenProxyReconciler) readReports(ctx context.Context, s *fleetScope, now time.Time) (*reports, error) {
	tp, generation, digest := s.tp, s.cfg.generation, s.cfg.digest
	var leases coordinationv1.LeaseList
	if err := r.List(ctx, &leases, client.InNamespace(tp.Namespace),
		client.MatchingLabels{twv1alpha1.ReplicaConfigMapLabel: proxyName(tp)}); err != nil {
		return nil, fmt.Errorf("list Leases: %w", err)
	}
	rs := &reports{}
	r.renewals.keepOnly(client.ObjectKeyFromObject(tp), leases.Items)
	for i := range leases.Items {
		le := &leases.Items[i]
		if !le.DeletionTimestamp.IsZero() {
			continue
		}
		expires, drop := r.renewals.expiry(client.ObjectKeyFromObject(tp), le, now)
		if !expires.After(now) {
			if drop.After(now) {
				// Not live (yet), but not given up on: a replica whose clock runs behind
				// shows it by renewing; look again then.
				if rs.next.IsZero() || drop.Before(rs.next) {
					rs.next = drop
				}
				continue
			}
			// Only the version read: a renewal that raced this read survives.
			rv := le.ResourceVersion
			err := r.Delete(ctx, le, client.Preconditions{ResourceVersion: &rv})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return nil, fmt.Errorf("delete expired Lease %s: %w", le.Name, err)
			}
			r.renewals.forget(le.UID)
			log.FromContext(ctx).V(1).Info("Deleted an expired replica Lease", "lease", le.Name, "expired", expires)
			continue
		}
		// A generation that does not parse is a replica behind every config.
		g, _ := strconv.ParseInt(le.Annotations[twv1alpha1.ReplicaGenerationAnnotation], 10, 64)
		other := g == generation && le.Annotations[twv1alpha1.ReplicaDigestAnnotation] != digest
		if other {
			g--
		}
		name := le.Name
		if le.Spec.HolderIdentity != nil && *le.Spec.HolderIdentity != "" {
			name = *le.Spec.HolderIdentity
		}
		rs.live = append(rs.live, replicaReport{name: name, generation: g, otherDoc: other, expires: expires,
			epochs: parseEpochs(le.Annotations[twv1alpha1.ReplicaDurableEpochsAnnotation]),
			health: parseHealth(le.Annotations[twv1alpha1.ReplicaUpstreamHealthAnnotation]),
			ledger: parseLedger(le.Annotations[twv1alpha1.ReplicaLedgerAnnotation])})
		if rs.next.IsZero() || expires.Before(rs.next) {
			rs.next = expires
		}
	}
	slices.SortFunc(rs.live, func(a, b replicaReport) int { return strings.Compare(a.name, b.name) })
	return rs, nil
}

// renewals remembers, per Lease, the renewTime last read and when the operator first
// read it, on the operator's own clock. A Lease is live while its renewTime plus its
// duration is in the future, or, for a replica whose clock runs behind, while the
// operator has seen its renewTime change within the last duration: liveness never
// depends on the two clocks agreeing. A Lease that is neither is deleted once it has
// gone a whole duration without a change the operator saw.
type renewals struct {
	mu   sync.Mutex
	seen map[types.UID]renewal
}

type renewal struct {
	fleet     types.NamespacedName
	renewTime time.Time // as the replica wrote it
	at        time.Time // when the operator first read that value
	changed   bool      // at is a change the operator saw, not its first sight
}

// expiry returns when the Lease stops being live (at or before now: not live) and
// when, unless renewed, it may be deleted.
func (rn *renewals) expiry(fleet types.NamespacedName, le *coordinationv1.Lease, now time.Time) (expires, drop time.Time) {
	if le.Spec.RenewTime == nil || le.Spec.LeaseDurationSeconds == nil {
		return time.Time{}, time.Time{}
	}
	d := time.Duration(*le.Spec.LeaseDurationSeconds) * time.Second
	renewed := le.Spec.RenewTime.Time
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.seen == nil {
		rn.seen = map[types.UID]renewal{}
	}
	prev, ok := rn.seen[le.UID]
	if !ok || !prev.renewTime.Equal(renewed) {
		prev = renewal{fleet: fleet, renewTime: renewed, at: now, changed: ok}
		rn.seen[le.UID] = prev
	}
	expires = renewed.Add(d)
	if prev.changed && prev.at.Add(d).After(expires) {
		expires = prev.at.Add(d)
	}
	return expires, prev.at.Add(d)
}

// keepOnly forgets the fleet's Leases that are gone (a replica that stopped cleanly
// deletes its own).
func (rn *renewals) keepOnly(fleet types.NamespacedName, leases []coordinationv1.Lease) {
	present := make(map[types.UID]bool, len(leases))
	for i := range leases {
		present[leases[i].UID] = true
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	for uid, r := range rn.seen {
		if r.fleet == fleet && !present[uid] {
			delete(rn.seen, uid)
		}
	}
}

// forget drops a deleted Lease.
func (rn *renewals) forget(uid types.UID) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	delete(rn.seen, uid)
}

// requeue is when the next Lease expires, if it is not renewed: time-driven work.
func (rs *reports) requeue(now time.Time) time.Duration {
	if rs.next.IsZero() {
		return 0
	}
	// A little after the expiry, so that the Lease is expired when it is read.
	d := rs.next.Sub(now) + 100*time.Millisecond
	if rs.ledgerWait {
		d = min(d, ledgerWaitRequeue)
	}
	return d
}

// ledgerWaitRequeue is how often the flushed-through times are read again while lost
// counters wait for them.
const ledgerWaitRequeue = 2 * time.Second

// proxyOfLease maps a replica's Lease to the TokenProxy whose ConfigMap it serves.
func (r *TokenProxyReconciler) proxyOfLease(ctx context.Context, o client.Object) []reconcile.Request {
	cm := o.GetLabels()[twv1alpha1.ReplicaConfigMapLabel]
	if cm == "" {
		return nil
	}
	var tps twv1alpha1.TokenProxyList
	if err := r.List(ctx, &tps, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	for i := range tps.Items {
		if proxyName(&tps.Items[i]) == cm {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: tps.Items[i].Name}}}
		}
	}
	return nil
}

// leaseReportChanged passes a replica arriving, leaving, reporting another config,
// other durable epochs (a fence found or lifted, an attestation) or a ledger that
// starts or stops spooling;
// not a renewal, which changes only renewTime (the requeue at the earliest expiry
// sees whether it was renewed). A fleet of N replicas thus reconciles on what its
// replicas load, not N times per renewal period.
func leaseReportChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			a, b := e.ObjectOld, e.ObjectNew
			for _, k := range []string{twv1alpha1.ReplicaGenerationAnnotation, twv1alpha1.ReplicaDigestAnnotation,
				twv1alpha1.ReplicaDurableEpochsAnnotation, twv1alpha1.ReplicaUpstreamHealthAnnotation} {
				if a.GetAnnotations()[k] != b.GetAnnotations()[k] {
					return true
				}
			}
			if ledgerKey(a.GetAnnotations()[twv1alpha1.ReplicaLedgerAnnotation]) != ledgerKey(b.GetAnnotations()[twv1alpha1.ReplicaLedgerAnnotation]) {
				return true
			}
			return a.GetLabels()[twv1alpha1.ReplicaConfigMapLabel] != b.GetLabels()[twv1alpha1.ReplicaConfigMapLabel]
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
