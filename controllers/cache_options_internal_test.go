// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"reflect"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// TestCacheOptionsOneSelectionPerType: the manager's cache options set each type once,
// so the cache cannot pick, at random, a selection without its transform, and the
// ConfigMaps' selection caches a chunk's hash, not its text.
func TestCacheOptionsOneSelectionPerType(t *testing.T) {
	opts := CacheOptions()
	byType := map[reflect.Type][]cache.ByObject{}
	for o, b := range opts.ByObject {
		byType[reflect.TypeOf(o)] = append(byType[reflect.TypeOf(o)], b)
	}
	for typ, bs := range byType {
		if len(bs) != 1 {
			t.Errorf("%v has %d selections, want 1: the cache keeps one of them at random", typ, len(bs))
		}
	}
	cms := byType[reflect.TypeOf(&corev1.ConfigMap{})]
	if len(cms) == 0 {
		t.Fatal("no selection of ConfigMaps")
	}
	for _, b := range cms {
		if b.Transform == nil {
			t.Error("a ConfigMap selection without a transform: the cache would hold every chunk's text")
			continue
		}
		text := `{"name":"key-000001","key_sha256":"0123"}` + "\n"
		o, err := b.Transform(&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy-0123456789abcdef", Labels: map[string]string{render.ChunkOfLabel: "fleet-proxy"}},
			Data:       map[string]string{config.ChunkKey: text},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := o.(*corev1.ConfigMap).Data[config.ChunkKey]; got == text || len(got) != 64 {
			t.Errorf("the cache holds a chunk as %q, want the 64 hex digits of its SHA-256", got)
		}
	}
	if n := len(byType[reflect.TypeOf(&coordinationv1.Lease{})]); n != 1 {
		t.Errorf("Leases have %d selections, want the replicas' only", n)
	}
}

// TestSetByObjectReplaces: a second setting of a type replaces the first, whichever
// pointer it came with.
func TestSetByObjectReplaces(t *testing.T) {
	m := map[client.Object]cache.ByObject{}
	setByObject(m, &corev1.ConfigMap{}, cache.ByObject{})
	setByObject(m, &corev1.Secret{}, cache.ByObject{})
	setByObject(m, &corev1.ConfigMap{}, cache.ByObject{Transform: render.SlimConfigMap})
	if len(m) != 2 {
		t.Fatalf("%d selections, want 2", len(m))
	}
	for o, b := range m {
		if _, ok := o.(*corev1.ConfigMap); ok && b.Transform == nil {
			t.Error("the first ConfigMap selection was kept")
		}
	}
}
