// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// Status writes out of the reconcile, by default.
const (
	// DefaultStatusWritesPerSecond bounds the TokenBudget and ApiKey status writes of
	// every fleet together.
	DefaultStatusWritesPerSecond = 200
	// DefaultStatusWriters is how many status writes run at once.
	DefaultStatusWriters = 4
)

// statusKind tells the objects a statusWriter writes apart.
type statusKind uint8

const (
	budgetStatus statusKind = iota
	keyStatus
)

// statusKey names one object whose status is written.
type statusKey struct {
	kind statusKind
	name types.NamespacedName
}

// pendingStatus is the latest status computed for one object, not yet written: no
// copy of the object, which a burst's backlog of thousands would hold.
type pendingStatus struct {
	fleet types.NamespacedName
	// patch is a TokenBudget's: a merge patch of its status.
	patch []byte
	// status is an ApiKey's, which replaces the stored status unless the key changed
	// since resourceVersion (the write conflicts then).
	status          *twv1alpha1.ApiKeyStatus
	resourceVersion string
	// inputs is the digest of a key's keyStatusInputs, which a reconcile finds
	// already queued; 0 for none.
	inputs inputsDigest
	// cancelled says the object was found current while this status was written.
	cancelled bool
	// first says the object's status does not yet say its generation: a new object,
	// or one whose spec changed (firstStatus). It is written before the fleet's
	// other statuses.
	first bool
}

// firstStatus says whether an object of generation gen whose status observed
// observed waits for its first status of that generation: what its owner waits for
// after a create or an edit, and so written before the statuses that only follow
// the fleet (a scale's per-replica allowances, the replicas' reports).
func firstStatus(gen, observed int64) bool { return observed != gen }

// fleetStatuses are one fleet's queued statuses: first those of objects waiting for
// their first status (pendingStatus.first), then the others.
type fleetStatuses struct {
	first, rest map[statusKey]*pendingStatus
}

func (f *fleetStatuses) len() int { return len(f.first) + len(f.rest) }

// get is the status queued for k, nil for none.
func (f *fleetStatuses) get(k statusKey) *pendingStatus {
	if p := f.first[k]; p != nil {
		return p
	}
	return f.rest[k]
}

// getIfAny is get on f, which may be nil.
func (f *fleetStatuses) getIfAny(k statusKey) *pendingStatus {
	if f == nil {
		return nil
	}
	return f.get(k)
}

func (f *fleetStatuses) delete(k statusKey) {
	delete(f.first, k)
	delete(f.rest, k)
}

// statusBatch is how many statuses of one fleet a worker writes before it turns to
// the next fleet that has some.
const statusBatch = 20

// statusWriter writes the TokenBudget and ApiKey statuses a reconcile computed,
// apart from the reconcile: a fleet's config and workload never wait behind a
// backlog of status writes (a burst of thousands of new keys), which its own workers
// write at a bounded rate, so that they never starve the API server's other clients
// either. Within a fleet, an object waiting for its first status of its generation
// (a key just created) goes before the statuses that only follow the fleet (a
// scale's thousands of per-replica allowances). The fleets take turns, statusBatch
// statuses at a time, so that one fleet's burst does not hold up another's few
// statuses; the writes of a batch run at once, workers at most in all, so that one
// fleet's burst is written by every writer and not one at a time (one write at a
// time made about 10 a second on a loaded machine). The latest status computed for
// an object wins over one still queued. A write that conflicts (the object changed
// since it was read) or fails queues its fleet's reconcile, which computes the
// status again; a failure is reported by that reconcile as the Status step's.
type statusWriter struct {
	client  client.Client
	limiter flowcontrol.RateLimiter
	workers int
	// slots bounds the writes in flight, of every fleet together, at workers.
	slots chan struct{}
	// queue holds the fleets with statuses to write; one worker writes a fleet's at
	// a time.
	queue *workqueue.Typed[types.NamespacedName]
	// fleets queues a fleet's reconcile.
	fleets chan event.TypedGenericEvent[types.NamespacedName]

	mu      sync.Mutex
	pending map[types.NamespacedName]*fleetStatuses
	writing map[statusKey]*pendingStatus
	failed  map[types.NamespacedName]error
	// wroteOver is, for each ApiKey whose status was written and that no reconcile
	// has read since at a later version, the resourceVersion the write replaced:
	// while the cache holds that version, a status computed from it would conflict
	// (stale).
	wroteOver map[types.NamespacedName]string
}

// newStatusWriter writes with c, perSecond writes a second at most, workers at once.
func newStatusWriter(c client.Client, perSecond float32, workers int) *statusWriter {
	if perSecond <= 0 {
		perSecond = DefaultStatusWritesPerSecond
	}
	if workers <= 0 {
		workers = DefaultStatusWriters
	}
	return &statusWriter{
		client:  c,
		limiter: flowcontrol.NewTokenBucketRateLimiter(perSecond, max(int(perSecond/4), 1)),
		workers: workers,
		slots:   make(chan struct{}, workers),
		queue:   workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[types.NamespacedName]{Name: "tokenwarden-statuses"}),
		fleets:  make(chan event.TypedGenericEvent[types.NamespacedName], 1024),
		pending: map[types.NamespacedName]*fleetStatuses{},
		writing: map[statusKey]*pendingStatus{},
		failed:  map[types.NamespacedName]error{},

		wroteOver: map[types.NamespacedName]string{},
	}
}

// source is the fleets whose reconcile the writer queues, for the controller to watch.
func (w *statusWriter) source() source.Source {
	return source.Channel(w.fleets, handler.TypedFuncs[types.NamespacedName, reconcile.Request]{
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[types.NamespacedName], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			q.Add(reconcile.Request{NamespacedName: e.Object})
		},
	})
}

// enqueue queues p as the status of the object k names, in place of any queued.
func (w *statusWriter) enqueue(k statusKey, p *pendingStatus) {
	w.mu.Lock()
	f := w.pending[p.fleet]
	if f == nil {
		f = &fleetStatuses{first: map[statusKey]*pendingStatus{}, rest: map[statusKey]*pendingStatus{}}
		w.pending[p.fleet] = f
	}
	f.delete(k)
	if p.first {
		f.first[k] = p
	} else {
		f.rest[k] = p
	}
	w.mu.Unlock()
	w.queue.Add(p.fleet)
}

// cancel forgets the status queued for k, if any: the object holds the status its
// latest inputs give.
func (w *statusWriter) cancel(fleet types.NamespacedName, k statusKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if f := w.pending[fleet]; f != nil {
		f.delete(k)
	}
	if p := w.writing[k]; p != nil {
		p.cancelled = true
	}
}

// queued says whether the key status queued or being written for k was computed from in.
func (w *statusWriter) queued(fleet types.NamespacedName, k statusKey, in inputsDigest) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	var p *pendingStatus
	if f := w.pending[fleet]; f != nil {
		p = f.get(k)
	}
	if p == nil {
		p = w.writing[k]
	}
	return p != nil && p.inputs != 0 && p.inputs == in
}

// failure is the error of the fleet's last failed write since the last call, and
// forgets it.
func (w *statusWriter) failure(fleet types.NamespacedName) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.failed[fleet]
	delete(w.failed, fleet)
	return err
}

// Start runs the workers until ctx is done (the manager runs it, on the leader).
func (w *statusWriter) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range w.workers {
		wg.Go(func() {
			for w.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	w.queue.ShutDown()
	wg.Wait()
	return nil
}

// next writes up to statusBatch queued statuses of the next fleet, several at once,
// and queues the fleet again behind the others when it has more; false once the
// queue is shut down.
func (w *statusWriter) next(ctx context.Context) bool {
	fleet, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(fleet)
	var wg sync.WaitGroup
	defer wg.Wait()
	for range statusBatch {
		k, p := w.take(fleet)
		if p == nil {
			break
		}
		if err := w.limiter.Wait(ctx); err != nil {
			return true
		}
		select {
		case w.slots <- struct{}{}:
		case <-ctx.Done():
			return true
		}
		wg.Go(func() {
			defer func() { <-w.slots }()
			w.finish(ctx, k, p, w.write(ctx, k, p))
		})
	}
	wg.Wait()
	w.mu.Lock()
	more := w.pending[fleet] != nil && w.pending[fleet].len() > 0
	w.mu.Unlock()
	if more {
		w.queue.Add(fleet)
	}
	return true
}

// take moves one of the fleet's queued statuses to those being written, a first
// status before any other: none of an object whose status is being written (its next
// write waits for that one's end).
func (w *statusWriter) take(fleet types.NamespacedName) (statusKey, *pendingStatus) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f := w.pending[fleet]
	if f == nil {
		return statusKey{}, nil
	}
	for _, m := range []map[statusKey]*pendingStatus{f.first, f.rest} {
		for k, p := range m {
			if w.writing[k] != nil {
				continue
			}
			delete(m, k)
			w.writing[k] = p
			return k, p
		}
	}
	if f.len() == 0 {
		delete(w.pending, fleet)
	}
	return statusKey{}, nil
}

// finish records the write of p: a failure, for the fleet's next reconcile, which it
// queues, as it does when the status was found current while it was written
// (this write overwrote it) and none is queued since.
func (w *statusWriter) finish(ctx context.Context, k statusKey, p *pendingStatus, err error) {
	w.mu.Lock()
	delete(w.writing, k)
	if err != nil && !apierrors.IsConflict(err) {
		w.failed[p.fleet] = err
	}
	f := w.pending[p.fleet]
	again := err != nil || (p.cancelled && (f == nil || f.get(k) == nil))
	if err == nil && k.kind == keyStatus {
		w.wroteOver[k.name] = p.resourceVersion
		// A status queued meanwhile from the version this write replaced would
		// conflict: the fleet's reconcile computes it again from the key as written.
		if q := f.getIfAny(k); q != nil && q.resourceVersion == p.resourceVersion {
			f.delete(k)
			again = true
		}
	}
	w.mu.Unlock()
	if again {
		log.FromContext(ctx).V(1).Info("Status write to settle again", "object", k.name, "error", err)
		w.requeue(ctx, p.fleet)
	}
}

// stale says whether resourceVersion is the version of the ApiKey k that its last
// status write replaced: the cache has not caught up with that write, and a status
// computed from it would conflict. A later version forgets the write.
func (w *statusWriter) stale(k types.NamespacedName, resourceVersion string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	was, there := w.wroteOver[k]
	if !there {
		return false
	}
	if was == resourceVersion {
		return true
	}
	delete(w.wroteOver, k)
	return false
}

// write writes p, the status of the object k names; an object that is gone has no
// status to write.
func (w *statusWriter) write(ctx context.Context, k statusKey, p *pendingStatus) error {
	meta := metav1.ObjectMeta{Namespace: k.name.Namespace, Name: k.name.Name}
	var err error
	switch k.kind {
	case budgetStatus:
		err = w.client.Status().Patch(ctx, &twv1alpha1.TokenBudget{ObjectMeta: meta}, client.RawPatch(types.MergePatchType, p.patch))
	case keyStatus:
		meta.ResourceVersion = p.resourceVersion
		err = w.client.Status().Update(ctx, &twv1alpha1.ApiKey{ObjectMeta: meta, Status: *p.status})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("patch status of %s: %w", k.name.Name, err)
	}
	return nil
}

// requeue queues the fleet's reconcile.
func (w *statusWriter) requeue(ctx context.Context, fleet types.NamespacedName) {
	select {
	case w.fleets <- event.TypedGenericEvent[types.NamespacedName]{Object: fleet}:
	case <-ctx.Done():
	}
}
