// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// Most reconciles of a large fleet change nothing in its document: they follow the
// operator's own writes (the TokenProxy's status, the ConfigMap) or a replica's
// report. Rendering, checking, encoding and splitting 50,000 keys for each of them
// held about 100 MB at that size and most of a reconcile's time (issue 14). So each
// fleet remembers the digest of what its document was last rendered from (renderInputs)
// and what that render led to: while the inputs are the same and the fleet's
// ConfigMap and chunks are as that write left them, the config step reuses the
// outcome without rendering.

// configMemo is a fleet's last config outcome and what it was rendered from.
type configMemo struct {
	inputs [sha256.Size]byte
	// outcome is what the config step left: written, or refused.
	outcome configOutcome
	// configMapVersion is the fleet ConfigMap's resourceVersion after the write, for
	// a written outcome.
	configMapVersion string
}

// configMemos holds each fleet's configMemo, by TokenProxy namespace and name.
type configMemos struct{ m sync.Map }

func (c *configMemos) get(fleet types.NamespacedName) (configMemo, bool) {
	v, ok := c.m.Load(fleet)
	if !ok {
		return configMemo{}, false
	}
	return v.(configMemo), true
}

func (c *configMemos) put(fleet types.NamespacedName, m configMemo) { c.m.Store(fleet, m) }

func (c *configMemos) forget(fleet types.NamespacedName) { c.m.Delete(fleet) }

// renderInputs is the SHA-256 of everything render reads: the TokenProxy's identity,
// spec (by its generation) and durable epochs, the division, and each budget and key
// in force, in order, by identity and spec generation, with each key's hash.
func renderInputs(f *render.Fleet) [sha256.Size]byte {
	h := sha256.New()
	// The inputs are written through one buffer, without a copy of each string.
	buf := make([]byte, 0, 32<<10)
	flush := func() {
		h.Write(buf)
		buf = buf[:0]
	}
	str := func(s string) {
		if len(buf)+8+len(s) > cap(buf) {
			flush()
		}
		buf = binary.LittleEndian.AppendUint64(buf, uint64(len(s)))
		buf = append(buf, s...)
	}
	num := func(v int64) {
		if len(buf)+8 > cap(buf) {
			flush()
		}
		buf = binary.LittleEndian.AppendUint64(buf, uint64(v))
	}
	p := f.Proxy
	str(string(p.UID))
	str(p.Namespace)
	str(p.Name)
	num(p.Generation)
	// The tenancy may come from the status, where the first reconcile records it.
	str(string(render.TenancyOf(p)))
	epochs, _ := json.Marshal(p.Status.DurableEpochs)
	str(string(epochs))
	num(f.Divisor)
	num(int64(len(f.Budgets)))
	for _, b := range f.Budgets {
		str(string(b.UID))
		str(b.Namespace)
		str(b.Name)
		num(b.Generation)
	}
	num(int64(len(f.Keys)))
	for _, k := range f.Keys {
		str(string(k.Key.UID))
		str(k.Key.Namespace)
		str(k.Key.Name)
		num(k.Key.Generation)
		str(k.Hash)
		str(k.Environment)
	}
	flush()
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// configUnchanged tells whether the fleet's ConfigMap and the chunks it names are as
// the memo's write left them, as the cache holds them.
func (r *TokenProxyReconciler) configUnchanged(ctx context.Context, tp *twv1alpha1.TokenProxy, m configMemo) bool {
	var live corev1.ConfigMap
	if err := r.Get(ctx, types.NamespacedName{Namespace: tp.Namespace, Name: proxyName(tp)}, &live); err != nil {
		return false
	}
	if live.ResourceVersion != m.configMapVersion {
		return false
	}
	if len(m.outcome.chunks) == 0 {
		return true
	}
	var cms corev1.ConfigMapList
	if err := r.List(ctx, &cms, client.InNamespace(tp.Namespace), client.MatchingLabels{render.ChunkOfLabel: proxyName(tp)},
		client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	there := 0
	for i := range cms.Items {
		if slices.Contains(m.outcome.chunks, cms.Items[i].Name) && cms.Items[i].DeletionTimestamp.IsZero() {
			there++
		}
	}
	return there == len(m.outcome.chunks)
}
