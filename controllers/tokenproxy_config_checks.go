// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// checkRendered loads a rendered document the way every proxy of the fleet will:
// encoded as it is written, then the proxy's own strict parse, defaults and
// validation. A document that fails here would be refused by every proxy on reload,
// so it is never written.
//
// The keys are checked as they are (config.ParseKeys), not encoded and decoded: they
// are most of a large fleet's document, and this runs on every change.
func checkRendered(cfg *config.Config) error {
	shell := *cfg
	shell.APIKeys = nil
	doc, err := render.Encode(&shell)
	if err != nil {
		return err
	}
	_, err = config.ParseKeys(doc, slices.Clone(cfg.APIKeys))
	return err
}

// refuseConfig records that the fleet's rendered config is invalid: the ConfigMap and
// the statuses of the fleet's budgets and keys stay as they were (the proxies keep
// enforcing the last good document), the TokenProxy reports Accepted=False,
// InvalidConfig with every invalid field, and a warning event is recorded when the
// fleet stops being accepted. The rest of the fleet (its Deployment's scale, its
// Services) is still reconciled. Nothing is retried: the next change of a referenced
// object reconciles again.
func (r *TokenProxyReconciler) refuseConfig(tp *twv1alpha1.TokenProxy, conds *[]metav1.Condition, invalid error) {
	msg := "The rendered proxy config is not written, because the proxy would refuse it; the fleet keeps its last config: " +
		strings.ReplaceAll(invalid.Error(), "\n", "; ")
	if !meta.IsStatusConditionPresentAndEqual(*conds, twv1alpha1.ConditionAccepted, metav1.ConditionFalse) {
		r.Events.Eventf(tp, nil, corev1.EventTypeWarning, twv1alpha1.ReasonInvalidConfig, "Render", "%s", truncate(msg, eventNoteLimit))
	}
	setCondition(conds, twv1alpha1.ConditionAccepted, false, twv1alpha1.ReasonInvalidConfig, truncate(msg, conditionMessageLimit), tp.Generation)
}

// The API server's limits on an event's note and a condition's message, in bytes.
const (
	eventNoteLimit        = 1024
	conditionMessageLimit = 32768
)

// truncate shortens msg to at most limit bytes, on a rune boundary, marking the cut.
func truncate(msg string, limit int) string {
	if len(msg) <= limit {
		return msg
	}
	const more = " ..."
	cut := limit - len(more)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + more
}
