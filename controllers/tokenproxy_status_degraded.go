// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// setDegraded sets the TokenProxy's Degraded condition: True, with the first failed
// step's reason and every failure in the message, when a step failed; False
// otherwise. A warning event is recorded when it becomes True or its reason changes.
func (r *TokenProxyReconciler) setDegraded(tp *twv1alpha1.TokenProxy, conds *[]metav1.Condition, ss *steps) {
	if len(ss.failed) == 0 {
		setCondition(conds, twv1alpha1.ConditionDegraded, false, twv1alpha1.ReasonReconciled, "Every step of the reconcile succeeded", tp.Generation)
		return
	}
	reason := string(ss.failed[0].step) + "Failed"
	var taken *chunkTakenError
	if errors.As(ss.failed[0].err, &taken) {
		reason = twv1alpha1.ReasonConfigChunkTaken
	}
	msgs := make([]string, 0, len(ss.failed))
	for _, f := range ss.failed {
		msgs = append(msgs, fmt.Sprintf("%s: %v", f.step, f.err))
	}
	next := "the other steps ran, and the failed ones are retried"
	if ss.failed[0].step == stepRead {
		next = "the operator renders and changes nothing of the fleet until it can read what the fleet is made of, and retries"
	}
	msg := strings.Join(msgs, "; ") + "; " + next
	if prev := meta.FindStatusCondition(*conds, twv1alpha1.ConditionDegraded); prev == nil ||
		prev.Status != metav1.ConditionTrue || prev.Reason != reason {
		r.Events.Eventf(tp, nil, corev1.EventTypeWarning, reason, "Reconcile", "%s", truncate(msg, eventNoteLimit))
	}
	setCondition(conds, twv1alpha1.ConditionDegraded, true, reason, truncate(msg, conditionMessageLimit), tp.Generation)
}

// reportUnread sets Degraded=ReadFailed on the TokenProxy when what the fleet is
// rendered from (its budgets, keys, Secrets, Deployment) could not be read, and
// returns the error so that the request is retried. Nothing else of the status changes.
func (r *TokenProxyReconciler) reportUnread(ctx context.Context, tp *twv1alpha1.TokenProxy, readErr error) error {
	ss := steps{failed: []stepFailure{{step: stepRead, err: readErr}}}
	st := tp.Status.DeepCopy()
	r.setDegraded(tp, &st.Conditions, &ss)
	if err := r.writeProxyStatus(ctx, tp, st); err != nil {
		return errors.Join(readErr, err)
	}
	return ss.err()
}
