// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"fmt"
	"hash/maphash"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// queueObjectStatuses queues the status of every TokenBudget and ApiKey the fleet read
// whose status changes, once its config (of generation s.cfg.generation) is written,
// and records events for what an operator must act on. It says whether it left a
// key whose status was just written, as the cache does not hold yet (stale): the
// fleet is to be reconciled again shortly for it.
func (r *TokenProxyReconciler) queueObjectStatuses(s *fleetScope, rs *reports) (stale bool) {
	tp, g, generation := s.tp, s.gathered, s.cfg.generation
	fleet := client.ObjectKeyFromObject(tp)
	redis := tp.Spec.Storage.Type == twv1alpha1.StorageRedis
	storage := storageOf(tp)
	inForce := g.Divisor
	placement := fmt.Sprintf("memory storage: each of the %d replicas enforces 1/%d of it", g.Divisor, g.Divisor)
	if redis {
		inForce = 1
		placement = "Redis storage: the replicas share the fleet total"
	}
	// The Ready message names the generation that first held the object's content
	// (status.configGeneration), not the latest: another object's edit leaves it alone.
	inConfig := func(contentGen int64) string { return fmt.Sprintf("In the fleet's config (generation %d)", contentGen) }

	for _, b := range g.allBudgets {
		v := g.budgetVerdicts[render.ObjectKey(b)]
		st := b.Status.DeepCopy()
		st.ObservedGeneration = b.Generation
		st.Storage = storage
		st.Replicas, st.PerReplica = 0, twv1alpha1.PerReplicaAllowance{}
		if v.accepted {
			st.Replicas = inForce
			tpm, tpd := tokenWindows(b)
			st.PerReplica = twv1alpha1.PerReplicaAllowance{
				TokensPerMinute: allowance(tpm, inForce),
				TokensPerDay:    allowance(tpd, inForce),
			}
		}
		st.Summary = render.Summary(tp, b, v.accepted, inForce)
		st.ConfigGeneration = contentGeneration(v.accepted, b.Generation, b.Status.ObservedGeneration, b.Status.ConfigGeneration,
			b.Status.Conditions, generation)
		r.applyVerdict(tp, b, &st.Conditions, v, inConfig(st.ConfigGeneration)+"; "+budgetPlacement(b, placement, redis))
		setEnforced(&st.Conditions, "budget", v, st.ConfigGeneration, rs, b.Generation)
		r.queueBudgetStatus(fleet, b, st)
	}

	memo := r.keyMemo(tp)
	// remembered counts the keys read that the memo holds: when it is the memo's size,
	// the memo holds no key that is gone.
	remembered := 0
	for _, read := range g.allKeys {
		k := read.key
		ok := types.NamespacedName{Namespace: k.Namespace, Name: k.Name}
		v := read.verdict
		fingerprint := read.fingerprint
		// A rotated Secret changes the key's content without changing its generation.
		prevConfigGen := k.Status.ConfigGeneration
		if k.Status.Fingerprint != fingerprint {
			prevConfigGen = 0
		}
		contentGen := contentGeneration(v.accepted, k.Generation, k.Status.ObservedGeneration, prevConfigGen,
			k.Status.Conditions, generation)
		in := keyStatusInputs{resourceVersion: k.ResourceVersion, proxyGeneration: tp.Generation, verdict: v,
			fingerprint: fingerprint, contentGen: contentGen, loaded: loadedStateOf(rs, contentGen)}.digest()
		if was, there := memo[ok]; there {
			if was == in {
				// The status this key already has is the one these inputs give.
				remembered++
				continue
			}
			delete(memo, ok)
		}
		if r.statuses.queued(fleet, statusKey{kind: keyStatus, name: ok}, in) {
			// Its status is computed from these inputs and queued already.
			continue
		}
		if r.statuses.stale(ok, k.ResourceVersion) {
			// The cache does not hold the key's last status write yet: a status
			// computed from this version would conflict.
			stale = true
			continue
		}
		st := k.Status.DeepCopy()
		st.ObservedGeneration = k.Generation
		st.Fingerprint = fingerprint
		st.ConfigGeneration = contentGen
		r.applyVerdict(tp, k, &st.Conditions, v, inConfig(st.ConfigGeneration)+agentPlacement(k, redis))
		setEnforced(&st.Conditions, "key", v, st.ConfigGeneration, rs, k.Generation)
		if equality.Semantic.DeepEqual(&k.Status, st) {
			memo[ok] = in
			remembered++
			r.statuses.cancel(fleet, statusKey{kind: keyStatus, name: ok})
			continue
		}
		r.queueKeyStatus(fleet, k, st, in)
	}
	if remembered != len(memo) {
		seen := make(map[types.NamespacedName]struct{}, len(g.allKeys))
		for _, read := range g.allKeys {
			seen[types.NamespacedName{Namespace: read.key.Namespace, Name: read.key.Name}] = struct{}{}
		}
		for ok := range memo {
			if _, there := seen[ok]; !there {
				delete(memo, ok)
			}
		}
	}
	return stale
}

// contentGeneration is the config generation that first held an accepted object's
// current content: the one it had, unless it was not in the config before or its spec
// changed since (then the config just rendered, generation g, is the first to hold
// it). 0 when the object is not in the config. It changes only with the object's own
// content, so a scale step or another object's edit leaves the object's status alone.
func contentGeneration(accepted bool, objGen, observedGen, prev int64, prevConds []metav1.Condition, g int64) int64 {
	switch {
	case !accepted:
		return 0
	case prev == 0, observedGen != objGen, !meta.IsStatusConditionTrue(prevConds, twv1alpha1.ConditionAccepted):
		return g
	default:
		return prev
	}
}

// setEnforced sets a budget's or key's Enforced condition: True when every live
// replica has loaded its content generation. The message names no replica count, so
// that a scale step rewrites no budget or key whose Enforced did not change.
func setEnforced(conds *[]metav1.Condition, what string, v verdict, contentGen int64, rs *reports, gen int64) {
	switch _, behind := rs.loaded(contentGen); {
	case !v.accepted:
		setCondition(conds, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonNotInConfig, "Not in the fleet's config: "+v.message, gen)
	case len(rs.live) == 0:
		setCondition(conds, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonPending,
			fmt.Sprintf("In config generation %d; no proxy replica reports (no renewed report Lease)", contentGen), gen)
	case behind != nil:
		setCondition(conds, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonPending,
			fmt.Sprintf("In config generation %d; replica %s %s", contentGen, behind.name, behind.loadedWhat()), gen)
	default:
		setCondition(conds, twv1alpha1.ConditionEnforced, true, twv1alpha1.ReasonEnforced,
			fmt.Sprintf("Every live proxy replica has loaded config generation %d or later, which holds this %s", contentGen, what), gen)
	}
}

// applyVerdict sets an object's Accepted and Ready conditions from its verdict, and
// records a warning event when it stops being accepted or is refused for another
// reason (a budget refused as ProxyNotFound until its fleet exists, then as
// NeedsRedis): what an operator acts on.
func (r *TokenProxyReconciler) applyVerdict(tp *twv1alpha1.TokenProxy, obj client.Object, conds *[]metav1.Condition, v verdict, readyMsg string) {
	gen := obj.GetGeneration()
	if v.accepted {
		setCondition(conds, twv1alpha1.ConditionAccepted, true, v.reason, v.message, gen)
		setCondition(conds, twv1alpha1.ConditionReady, true, twv1alpha1.ReasonRendered, readyMsg, gen)
		return
	}
	if was := meta.FindStatusCondition(*conds, twv1alpha1.ConditionAccepted); was == nil || was.Status != metav1.ConditionFalse || was.Reason != v.reason {
		r.Events.Eventf(obj, tp, corev1.EventTypeWarning, v.reason, "Render", "%s", v.message)
	}
	setCondition(conds, twv1alpha1.ConditionAccepted, false, v.reason, v.message, gen)
	setCondition(conds, twv1alpha1.ConditionReady, false, v.reason, "Not in the fleet's config: "+v.message, gen)
}

// tokenWindows are a budget's rolling minute and day limits of the Tokens amount, the
// ones status.perReplica reports (0: none).
func tokenWindows(b *twv1alpha1.TokenBudget) (minute, day int64) {
	for _, g := range render.Groups(b) {
		if g.Amount != twv1alpha1.AmountTokens {
			continue
		}
		for _, w := range g.Windows {
			switch {
			case w.Rolling == nil:
			case w.Rolling.Period == config.PeriodMinute && minute == 0:
				minute = int64(w.Limit)
			case w.Rolling.Period == config.PeriodDay && day == 0:
				day = int64(w.Limit)
			}
		}
	}
	return minute, day
}

// allowance is what each replica enforces of a fleet total: nil when unlimited.
func allowance(total, divisor int64) *int64 {
	a := budget.Divide(total, divisor)
	if !a.Limited() {
		return nil
	}
	n := a.Tokens()
	return &n
}

// keyStatusInputs are everything an ApiKey's status is computed from in
// queueObjectStatuses, but the fleet's identity: the key as read (its resourceVersion
// covers its spec and status), the fleet's generation, its verdict, the fingerprint
// of its Secret's key, its content generation and what the replicas have loaded of
// it. A key whose inputs are those of the last reconcile that found its status
// current is current still: a one-key change of a 50,000-key fleet computes and
// compares one status, not 50,000. The memo and the status writer's queue hold the
// inputs' digest, not the inputs.
type keyStatusInputs struct {
	resourceVersion string
	proxyGeneration int64
	verdict         verdict
	fingerprint     string
	contentGen      int64
	loaded          loadedState
}

// inputsSeed seeds the digests of key status inputs, which are compared only within
// this process.
var inputsSeed = maphash.MakeSeed()

// inputsDigest is a 64-bit digest of a key's keyStatusInputs; 0 is none. Two inputs
// that differ share a digest with a chance of 2^-64: a status left unwritten then is
// written by the key's next change. It holds none of the inputs' strings (the
// resourceVersion, the verdict's message, the fingerprint: about 0.2 KiB a key in
// the memo and as much again in a queued status).
type inputsDigest uint64

// digest is the inputs' digest.
func (in keyStatusInputs) digest() inputsDigest {
	return inputsDigest(maphash.Comparable(inputsSeed, in) | 1)
}

// loadedState is what setEnforced reads of the replicas' reports for one content
// generation.
type loadedState struct {
	live     int
	behind   string
	behindAt int64
	otherDoc bool
}

func loadedStateOf(rs *reports, contentGen int64) loadedState {
	_, behind := rs.loaded(contentGen)
	st := loadedState{live: len(rs.live)}
	if behind != nil {
		st.behind, st.behindAt, st.otherDoc = behind.name, behind.generation, behind.otherDoc
	}
	return st
}

// keyMemo is the fleet's memo of current key statuses, by ApiKey namespace and name:
// the digest of the inputs each was found current with. One fleet is reconciled by
// one worker at a time.
func (r *TokenProxyReconciler) keyMemo(tp *twv1alpha1.TokenProxy) map[types.NamespacedName]inputsDigest {
	m, _ := r.keyStatuses.LoadOrStore(client.ObjectKeyFromObject(tp), map[types.NamespacedName]inputsDigest{})
	return m.(map[types.NamespacedName]inputsDigest)
}
