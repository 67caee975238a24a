// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// credentialsAnnotation on the proxy pod template is a SHA-256 over the credential
// values the pods take from Secrets (upstream credentials, the Redis password), with
// their Secret names and keys. A rotated credential changes it, which rolls the pods:
// environment variables are read once, when a container starts.
const credentialsAnnotation = "tokenwarden.io/credentials-sha256"

// credentialSecretField indexes TokenProxies by the Secrets their pods read.
const credentialSecretField = "spec.credentialSecretRefs"

// credentialRef is one Secret key the proxy pods read, and the field that names it.
type credentialRef struct {
	field string
	ref   twv1alpha1.SecretKeyReference
}

// credentialRefs lists the Secret keys a fleet's pods read, in spec order; def is the
// operator's default ledger.
func credentialRefs(tp *twv1alpha1.TokenProxy, def *twv1alpha1.LedgerSpec) []credentialRef {
	var refs []credentialRef
	for _, u := range tp.Spec.Upstreams {
		if u.CredentialSecretRef != nil {
			refs = append(refs, credentialRef{field: fmt.Sprintf("spec.upstreams[%s].credentialSecretRef", u.Name), ref: *u.CredentialSecretRef})
		}
	}
	if rs := tp.Spec.Storage.Redis; tp.Spec.Storage.Type == twv1alpha1.StorageRedis && rs != nil && rs.PasswordSecretRef != nil {
		refs = append(refs, credentialRef{field: "spec.storage.redis.passwordSecretRef", ref: *rs.PasswordSecretRef})
	}
	if rs := tp.Spec.Storage.Redis; tp.Spec.Storage.Type == twv1alpha1.StorageRedis && rs != nil && rs.SentinelPasswordSecretRef != nil {
		refs = append(refs, credentialRef{field: "spec.storage.redis.sentinelPasswordSecretRef", ref: *rs.SentinelPasswordSecretRef})
	}
	if ref := checkPasswordRef(tp); ref != nil {
		refs = append(refs, credentialRef{field: "spec.storage.redis.storeChecks.passwordSecretRef", ref: *ref})
	}
	if l := render.EffectiveLedger(tp, def); l != nil {
		field := "spec.ledger.urlSecretRef"
		if tp.Spec.Ledger == nil || tp.Spec.Ledger.URLSecretRef == nil {
			field = "the operator's default ledger, --proxy-ledger-secret"
		}
		refs = append(refs, credentialRef{field: field, ref: *l.URLSecretRef})
	}
	if ref := cachePasswordRef(tp); ref != nil {
		refs = append(refs, credentialRef{field: "spec.cache.redis.passwordSecretRef", ref: *ref})
	}
	return refs
}

// checkPasswordRef is the store checks' credential's password, when the fleet stores
// its budgets in Redis and has one.
func checkPasswordRef(tp *twv1alpha1.TokenProxy) *twv1alpha1.SecretKeyReference {
	rs := tp.Spec.Storage.Redis
	if tp.Spec.Storage.Type != twv1alpha1.StorageRedis || rs == nil || rs.StoreChecks == nil {
		return nil
	}
	return rs.StoreChecks.PasswordSecretRef
}

// cachePasswordRef is the cache Redis' password, when the fleet's cache is on Redis
// and has one.
func cachePasswordRef(tp *twv1alpha1.TokenProxy) *twv1alpha1.SecretKeyReference {
	if c := tp.Spec.Cache; c != nil && c.Storage == twv1alpha1.StorageRedis && c.Redis != nil {
		return c.Redis.PasswordSecretRef
	}
	return nil
}

// credentialSecretNames is the index function of credentialSecretField.
func (r *TokenProxyReconciler) credentialSecretNames(o client.Object) []string {
	var names []string
	for _, c := range credentialRefs(o.(*twv1alpha1.TokenProxy), r.DefaultLedger) {
		if !slices.Contains(names, c.ref.Name) {
			names = append(names, c.ref.Name)
		}
	}
	return names
}

// credentials is what the fleet's pods read from Secrets.
type credentials struct {
	// hash is the value of credentialsAnnotation; empty when no credential is
	// referenced.
	hash string
	// missing describes each referenced Secret or key that does not exist, and
	// reason is the condition reason of the first.
	missing []string
	reason  string
}

// readCredentials reads every referenced credential and hashes them. A missing one is
// reported, not an error: the Deployment is still applied (its pods wait, in
// CreateContainerConfigError, until the Secret exists), but the hash is not changed
// while one is missing, so a deleted Secret never rolls pods that run into a
// template they cannot start.
func (r *TokenProxyReconciler) readCredentials(ctx context.Context, tp *twv1alpha1.TokenProxy) (credentials, error) {
	var c credentials
	refs := credentialRefs(tp, r.DefaultLedger)
	if len(refs) == 0 {
		return c, nil
	}
	h := sha256.New()
	for _, cr := range refs {
		var s corev1.Secret
		err := r.Get(ctx, types.NamespacedName{Namespace: tp.Namespace, Name: cr.ref.Name}, &s)
		switch {
		// The cache holds only the Secrets labelled for the operator's use.
		case apierrors.IsNotFound(err), err == nil && s.Labels[twv1alpha1.SecretUsageLabel] != twv1alpha1.SecretUsageCredential:
			c.missing = append(c.missing, fmt.Sprintf("No Secret %s labelled %s=%s (%s)",
				cr.ref.Name, twv1alpha1.SecretUsageLabel, twv1alpha1.SecretUsageCredential, cr.field))
			if c.reason == "" {
				c.reason = twv1alpha1.ReasonCredentialSecretNotFound
			}
			continue
		case err != nil:
			return c, fmt.Errorf("get Secret %s: %w", cr.ref.Name, err)
		}
		v, ok := s.Data[secretKey(cr.ref)]
		if !ok {
			c.missing = append(c.missing, fmt.Sprintf("Secret %s has no key %q (%s)", cr.ref.Name, secretKey(cr.ref), cr.field))
			if c.reason == "" {
				c.reason = twv1alpha1.ReasonCredentialSecretKeyMissing
			}
			continue
		}
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00", cr.ref.Name, secretKey(cr.ref), len(v))
		h.Write(v)
	}
	c.hash = hex.EncodeToString(h.Sum(nil))
	return c, nil
}

// setFleetAccepted sets the TokenProxy's Accepted condition: False while a credential
// Secret or key its pods read is missing (with a warning event when it becomes so),
// True otherwise.
func (r *TokenProxyReconciler) setFleetAccepted(tp *twv1alpha1.TokenProxy, conds *[]metav1.Condition, c credentials) {
	if len(c.missing) == 0 {
		setCondition(conds, twv1alpha1.ConditionAccepted, true, twv1alpha1.ReasonAccepted, "The fleet is rendered", tp.Generation)
		return
	}
	msg := strings.Join(c.missing, "; ") + ": the operator reads only Secrets labelled for its use; " +
		"the proxy pods cannot start while it is missing; pods already running keep the credential they started with"
	if !meta.IsStatusConditionPresentAndEqual(*conds, twv1alpha1.ConditionAccepted, metav1.ConditionFalse) {
		r.Events.Eventf(tp, nil, corev1.EventTypeWarning, c.reason, "Render", "%s", truncate(msg, eventNoteLimit))
	}
	setCondition(conds, twv1alpha1.ConditionAccepted, false, c.reason, truncate(msg, conditionMessageLimit), tp.Generation)
}
