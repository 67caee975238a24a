// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// TestSlimConfigMap: the cache holds a chunk's hash, not its text, and still tells
// the chunk of a name from other content; other ConfigMaps stay whole.
func TestSlimConfigMap(t *testing.T) {
	text := strings.Repeat(`{"name":"key-000001","key_sha256":"0123"}`+"\n", 1000)
	chunk := func() *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy-0123456789abcdef", Namespace: "ns",
				Labels: map[string]string{ChunkOfLabel: "fleet-proxy"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}},
			Data: map[string]string{config.ChunkKey: text},
		}
	}
	o, err := SlimConfigMap(chunk())
	if err != nil {
		t.Fatal(err)
	}
	cached := o.(*corev1.ConfigMap)
	if n := len(cached.Data[config.ChunkKey]); n != 64 {
		t.Errorf("the cached chunk holds %d bytes, want its 64 hex digits of SHA-256", n)
	}
	if cached.ManagedFields != nil {
		t.Error("managed fields are cached")
	}
	if !holdsChunk(cached, []byte(text)) {
		t.Error("the cached chunk does not hold its own text")
	}
	if holdsChunk(cached, []byte(text+" ")) {
		t.Error("the cached chunk holds other text")
	}
	// Transforming twice (a relist) changes nothing.
	again, err := SlimConfigMap(cached)
	if err != nil {
		t.Fatal(err)
	}
	if !holdsChunk(again.(*corev1.ConfigMap), []byte(text)) {
		t.Error("a second transform lost the chunk's hash")
	}
	// As read from the API server, whole.
	whole := chunk()
	if !holdsChunk(whole, []byte(text)) || holdsChunk(whole, []byte("other")) {
		t.Error("a whole chunk is not compared by its text")
	}
	// The fleet's own ConfigMap stays whole.
	fleetCM := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy"}, Data: map[string]string{ConfigKey: text}}
	o, _ = SlimConfigMap(fleetCM)
	if o.(*corev1.ConfigMap).Data[ConfigKey] != text {
		t.Error("the fleet's ConfigMap is not cached whole")
	}
}
