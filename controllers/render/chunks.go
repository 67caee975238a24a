// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"crypto/sha256"
	"encoding/hex"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// The operator needs of a config chunk ConfigMap it wrote only whether it holds the
// chunk of its name (checkChunk), so its cache holds the SHA-256 of the chunk's text
// instead of the text (issue 14): a 50,000-key fleet's chunks are its whole document
// twice (the current and the previous one), about 14 MB that the cache held besides
// what the proxies read from the API server. The transform marks such a ConfigMap with
// hashedChunkAnnotation; a ConfigMap read from the API server (apiReader) is whole.

// hashedChunkAnnotation marks a cached chunk ConfigMap whose config.ChunkKey value is
// the hex SHA-256 of the chunk's text. It exists only in the cache.
const hashedChunkAnnotation = "tokenwarden.io/cached-chunk"

// SlimConfigMap is the cache transform of ConfigMaps: no managed fields, and a chunk's
// text replaced by its hex SHA-256.
func SlimConfigMap(o any) (any, error) {
	cm, ok := o.(*corev1.ConfigMap)
	if !ok {
		return o, nil
	}
	cm.ManagedFields = nil
	if cm.Labels[ChunkOfLabel] == "" || cm.Annotations[hashedChunkAnnotation] != "" {
		return cm, nil
	}
	text, ok := cm.Data[config.ChunkKey]
	if !ok {
		return cm, nil
	}
	sum := sha256.Sum256([]byte(text))
	data := make(map[string]string, len(cm.Data))
	for k, v := range cm.Data {
		data[k] = v
	}
	data[config.ChunkKey] = hex.EncodeToString(sum[:])
	cm.Data = data
	annotations := make(map[string]string, len(cm.Annotations)+1)
	for k, v := range cm.Annotations {
		annotations[k] = v
	}
	annotations[hashedChunkAnnotation] = "sha256"
	cm.Annotations = annotations
	return cm, nil
}

var _ toolscache.TransformFunc = SlimConfigMap

// holdsChunk tells whether a chunk ConfigMap, as the cache holds it (SlimConfigMap) or
// as read whole, holds text under config.ChunkKey.
func holdsChunk(cm *corev1.ConfigMap, text []byte) bool {
	have, ok := cm.Data[config.ChunkKey]
	if !ok {
		return false
	}
	if cm.Annotations[hashedChunkAnnotation] != "" {
		sum := sha256.Sum256(text)
		return have == hex.EncodeToString(sum[:])
	}
	return have == string(text)
}

// HoldsChunkSum tells whether a chunk ConfigMap, as the cache holds it (SlimConfigMap)
// or as read whole, holds under config.ChunkKey a text of hex SHA-256 sum; a cached
// chunk is compared without hashing anything.
func HoldsChunkSum(cm *corev1.ConfigMap, sum string) bool {
	have, ok := cm.Data[config.ChunkKey]
	if !ok {
		return false
	}
	if cm.Annotations[hashedChunkAnnotation] != "" {
		return have == sum
	}
	h := sha256.Sum256([]byte(have))
	return hex.EncodeToString(h[:]) == sum
}

// ChunkOfLabel on a chunk ConfigMap names the fleet's ConfigMap whose manifest it
// belongs to.
const ChunkOfLabel = "tokenwarden.io/config-chunk-of"
