// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package report tells the control plane which config this replica enforces, and how
// much of its budgets is in use: a coordination.k8s.io/v1 Lease per replica, renewed
// while the replica runs, whose annotations carry the generation and digest of the
// config it has applied and a summary of its buckets' use and refusals (usage.go).
// The operator counts the renewed Leases as the fleet's live replicas, sets the
// Enforced conditions from them, and sums the usage reports into the TokenBudgets'
// status. It is the proxy's only write to the API server.
package report

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// The Lease's label and annotations; the operator's API package declares the same
// names (api/v1alpha1: ReplicaConfigMapLabel and the others). They are repeated here so
// that the data plane does not import the operator's API.
const (
	ConfigMapLabel       = "tokenwarden.io/configmap"
	GenerationAnnotation = "tokenwarden.io/config-generation"
	DigestAnnotation     = "tokenwarden.io/config-digest"
	// DurableEpochsAnnotation carries the epochs of the durable counters the replica
	// runs under, per slot group, and whether they are fenced: a JSON list of
	// {"group", "epoch", "fenced", "found"} (budget.GroupEpoch).
	DurableEpochsAnnotation = "tokenwarden.io/durable-epochs"
	// UpstreamHealthAnnotation carries the health of the model registry's upstreams
	// as this replica sees it: a JSON list of {"upstream", "breaker", "cooling"}.
	UpstreamHealthAnnotation = "tokenwarden.io/upstream-health"
	// LedgerAnnotation carries the state of the replica's ledger: a JSON object of
	// {"spooling", "full", "spool_batches", "spool_bytes", "oldest", "flushed_through",
	// "dropped_batches", "dropped_rows", "dropped_requests", "dropped_cost_micro_usd"
	// and the same four of "expired_"} (ledgerstate.State).
	LedgerAnnotation = "tokenwarden.io/ledger"
)

// Defaults of a Lease.
const (
	DefaultDuration = 15 * time.Second
	DefaultRenew    = 5 * time.Second
	// DefaultUsageEvery is how often a replica scans its buckets for its usage report.
	DefaultUsageEvery = 15 * time.Second
)

// Lease reports one replica of the fleet that serves one ConfigMap.
type Lease struct {
	Client    kubernetes.Interface
	Namespace string
	// ConfigMap is the name of the ConfigMap the replica serves.
	ConfigMap string
	// Replica names the replica (its pod name); the Lease is <ConfigMap>-<Replica>.
	Replica string
	// Duration is the Lease's leaseDurationSeconds: a replica that has not renewed
	// for this long is no longer live. Default 15s.
	Duration time.Duration
	// Renew is how often the Lease is renewed. Default 5s.
	Renew time.Duration
	Log   *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Usage, when set, builds the replica's usage report (the UsageAnnotation) every
	// UsageEvery. The Lease carries the report, and is written for it only when it
	// changed: an idle replica's renewals carry no report at all.
	Usage func(ctx context.Context) (string, error)
	// UsageEvery is how often Usage is called. Default DefaultUsageEvery.
	UsageEvery time.Duration
	// Epochs, when set, returns the value of DurableEpochsAnnotation ("" when the
	// replica has no durable counters): read at each write.
	Epochs func() string
	// Health, when set, returns the value of UpstreamHealthAnnotation ("" without a
	// model registry): read at each write.
	Health func() string
	// Ledger, when set, returns the value of LedgerAnnotation ("" without a
	// ledger): read at each write.
	Ledger func() string

	mu         sync.Mutex
	generation int64
	digest     string
	// owner is the ConfigMap, once read: the Lease's owner, so that it goes with the
	// fleet even when the replica is killed rather than stopped.
	owner *metav1.OwnerReference
	// applied wakes Run: a new config to report now.
	applied chan struct{}
	// created: this replica has created its Lease (or found it there): renewals patch it.
	created bool
	// usage is the latest usage report, usageWritten the one the Lease holds.
	usage, usageWritten string
	once                sync.Once
}

// Name is the Lease's name.
func (l *Lease) Name() string { return l.ConfigMap + "-" + l.Replica }

func (l *Lease) init() {
	l.once.Do(func() {
		l.applied = make(chan struct{}, 1)
		if l.Duration <= 0 {
			l.Duration = DefaultDuration
		}
		if l.Renew <= 0 {
			l.Renew = DefaultRenew
		}
		if l.Log == nil {
			l.Log = slog.Default()
		}
		if l.Now == nil {
			l.Now = time.Now
		}
		if l.UsageEvery <= 0 {
			l.UsageEvery = DefaultUsageEvery
		}
	})
}

// Changed asks Run to write the Lease now (the durable epochs changed: a fence to
// report, or one lifted).
func (l *Lease) Changed() {
	l.init()
	select {
	case l.applied <- struct{}{}:
	default:
	}
}

// Applied records the config the replica now enforces; Run reports it at once.
func (l *Lease) Applied(generation int64, digest string) {
	l.init()
	l.mu.Lock()
	l.generation, l.digest = generation, digest
	l.mu.Unlock()
	select {
	case l.applied <- struct{}{}:
	default:
	}
}

// Run renews the Lease until ctx ends, and writes it at once after each Applied;
// then it deletes the Lease, so that a replica that stops cleanly leaves the live set
// at once rather than when its Lease expires. A failed write is logged and retried on
// the next tick.
func (l *Lease) Run(ctx context.Context) {
	l.init()
	every := l.Renew
	if l.Usage != nil {
		every = min(every, l.UsageEvery)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var renewed, scanned time.Time
	for {
		now := l.Now()
		if l.Usage != nil && now.Sub(scanned) >= l.UsageEvery-every/2 {
			scanned = now
			if u, err := l.Usage(ctx); err != nil {
				if ctx.Err() == nil {
					l.Log.Warn("Could not build the replica's usage report; the Lease keeps the previous one", "error", err)
				}
			} else {
				l.mu.Lock()
				l.usage = u
				l.mu.Unlock()
			}
		}
		if now.Sub(renewed) >= l.Renew-every/2 || l.usageChanged() {
			renewed = now
			if err := l.write(ctx); err != nil && ctx.Err() == nil {
				l.Log.Warn("Could not renew the replica's report Lease", "lease", l.Namespace+"/"+l.Name(), "error", err)
			}
		}
		select {
		case <-ctx.Done():
			l.remove()
			return
		case <-tick.C:
		case <-l.applied:
			renewed = time.Time{} // a new config: report it now
		}
	}
}

// usageChanged reports whether the latest usage report is not the one the Lease holds.
func (l *Lease) usageChanged() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.usage != l.usageWritten
}

// write creates or renews the Lease with the config applied so far; before the first
// Applied there is nothing to report.
func (l *Lease) write(ctx context.Context) error {
	l.mu.Lock()
	generation, digest, usage, usageWritten := l.generation, l.digest, l.usage, l.usageWritten
	l.mu.Unlock()
	if digest == "" {
		return nil
	}
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	now := metav1.NewMicroTime(l.Now())
	if l.owner == nil {
		// The proxy may read its ConfigMap; without it the Lease has no owner and
		// expires (the operator deletes expired Leases of a fleet it still runs).
		if cm, err := l.Client.CoreV1().ConfigMaps(l.Namespace).Get(ctx, l.ConfigMap, metav1.GetOptions{}); err == nil {
			l.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID}
		}
	}
	fill := func(le *coordinationv1.Lease) {
		if l.owner != nil && len(le.OwnerReferences) == 0 {
			le.OwnerReferences = []metav1.OwnerReference{*l.owner}
		}
		if le.Labels == nil {
			le.Labels = map[string]string{}
		}
		le.Labels[ConfigMapLabel] = l.ConfigMap
		if le.Annotations == nil {
			le.Annotations = map[string]string{}
		}
		le.Annotations[GenerationAnnotation] = strconv.FormatInt(generation, 10)
		le.Annotations[DigestAnnotation] = digest
		if usage != "" && (usage != usageWritten || !l.created) {
			le.Annotations[UsageAnnotation] = usage
		}
		if l.Epochs != nil {
			if e := l.Epochs(); e != "" {
				le.Annotations[DurableEpochsAnnotation] = e
			}
		}
		if l.Health != nil {
			if h := l.Health(); h != "" {
				le.Annotations[UpstreamHealthAnnotation] = h
			}
		}
		if l.Ledger != nil {
			if s := l.Ledger(); s != "" {
				le.Annotations[LedgerAnnotation] = s
			}
		}
		le.Spec.HolderIdentity = ptr.To(l.Replica)
		le.Spec.LeaseDurationSeconds = ptr.To(int32(l.Duration / time.Second))
		le.Spec.RenewTime = &now
		if le.Spec.AcquireTime == nil {
			le.Spec.AcquireTime = &now
		}
	}
	// Create it, then patch it: the proxy never reads a Lease, so its Role may name the
	// Leases it may patch and delete (the operator adds each report Lease it sees
	// created) instead of granting every Lease of the namespace.
	le := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: l.Name(), Namespace: l.Namespace}}
	fill(le)
	if !l.created {
		_, err := leases.Create(ctx, le, metav1.CreateOptions{})
		switch {
		case err == nil:
			l.created = true
			l.wrote(usage)
			return nil
		case !apierrors.IsAlreadyExists(err):
			return fmt.Errorf("create: %w", err)
		}
		l.created = true
	}
	meta := map[string]any{"labels": le.Labels, "annotations": le.Annotations}
	if len(le.OwnerReferences) > 0 {
		meta["ownerReferences"] = le.OwnerReferences
	}
	le.Spec.AcquireTime = nil // kept from the create
	patch, err := json.Marshal(map[string]any{"metadata": meta, "spec": le.Spec})
	if err != nil {
		return err
	}
	if _, err := leases.Patch(ctx, l.Name(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			l.created = false // deleted (expired): create it again on the next write
		}
		return fmt.Errorf("patch: %w", err)
	}
	l.wrote(usage)
	return nil
}

// wrote records the usage report the Lease now holds.
func (l *Lease) wrote(usage string) {
	l.mu.Lock()
	l.usageWritten = usage
	l.mu.Unlock()
}

// remove deletes the Lease, with a short deadline of its own: the run's context is
// already done.
func (l *Lease) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := l.Client.CoordinationV1().Leases(l.Namespace).Delete(ctx, l.Name(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		l.Log.Warn("Could not delete the replica's report Lease; it expires", "lease", l.Namespace+"/"+l.Name(), "error", err)
	}
}
