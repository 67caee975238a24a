// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// A large fleet's document does not fit in one ConfigMap (1 MiB, its keys and values
// together): 50,000 key hashes alone are 3.2 MB of hex. The operator then splits it
// into chunks, each stored under ChunkKey in an immutable ConfigMap named after its
// content, and writes a Manifest that names them, in order, under ManifestKey in the
// fleet's ConfigMap in place of the document. A proxy applies a manifest's document
// only when it holds every chunk and their concatenation has the manifest's digest:
// never half a document.

const (
	// ManifestKey is the data key of a Manifest in the fleet's ConfigMap.
	ManifestKey = "manifest.yaml"
	// ChunkKey is the data key of a chunk in its ConfigMap.
	ChunkKey = "chunk"
	// MaxInline is the largest document kept whole in the fleet's ConfigMap, and the
	// largest chunk: under the ConfigMap limit of 1 MiB with room for the metadata.
	MaxInline = 900 << 10
	// chunkHashLen is how many hex digits of a chunk's SHA-256 name it.
	chunkHashLen = 16
)

// Manifest names the chunks of one document.
type Manifest struct {
	// Generation is the document's generation.
	Generation int64 `json:"generation"`
	// Digest is the Digest of the whole document, the concatenation of the chunks.
	Digest string `json:"digest"`
	// Size is the document's length in bytes.
	Size int64 `json:"size"`
	// Chunks are the names of the chunks' ConfigMaps, in the document's order.
	Chunks []string `json:"chunks"`
}

// ParseManifest decodes a manifest strictly.
func ParseManifest(data []byte) (*Manifest, error) {
	var m Manifest
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return nil, fmt.Errorf("parse manifest: %w", err)
	}
	if m.Digest == "" || len(m.Chunks) == 0 {
		return nil, errors.New("parse manifest: digest and chunks are required")
	}
	return &m, nil
}

// Marshal renders the manifest as YAML.
func (m *Manifest) Marshal() ([]byte, error) { return yaml.Marshal(m) }

// Chunk is one piece of a split document.
type Chunk struct {
	// Name is the name of its ConfigMap: the prefix, a dash and the first 16 hex
	// digits of the SHA-256 of Data, so equal content has one name and a name never
	// changes content.
	Name string
	Data []byte
}

// Split cuts a document of generation g into chunks of at most max bytes, each
// ending at a line break where there is one (else at a character boundary: a
// ConfigMap's data is UTF-8 text), named prefix-<hash>, and returns them with their
// manifest.
func Split(doc []byte, generation int64, prefix string, max int) ([]Chunk, *Manifest) {
	m := &Manifest{Generation: generation, Digest: Digest(doc), Size: int64(len(doc))}
	var chunks []Chunk
	for rest := doc; len(rest) > 0; {
		n := len(rest)
		if n > max {
			n = max
			if i := bytes.LastIndexByte(rest[:max], '\n'); i >= 0 {
				n = i + 1
			} else {
				for n > 0 && !utf8.RuneStart(rest[n]) {
					n--
				}
				if n == 0 {
					n = max
				}
			}
		}
		c := Chunk{Name: ChunkName(prefix, rest[:n]), Data: rest[:n]}
		chunks = append(chunks, c)
		m.Chunks = append(m.Chunks, c.Name)
		rest = rest[n:]
	}
	return chunks, m
}

// ChunkName is the content-addressed name of a chunk.
func ChunkName(prefix string, data []byte) string {
	sum := sha256.Sum256(data)
	return prefix + "-" + hex.EncodeToString(sum[:])[:chunkHashLen]
}

// ErrChunkMissing is returned by Assemble when a chunk is not at hand (yet).
var ErrChunkMissing = errors.New("chunk missing")

// Assemble concatenates the manifest's chunks, which get returns by name (ok false
// when it has none of that name), and checks the result against the manifest's
// digest.
func (m *Manifest) Assemble(get func(name string) (data []byte, ok bool)) ([]byte, error) {
	doc := make([]byte, 0, m.Size)
	for _, name := range m.Chunks {
		data, ok := get(name)
		if !ok {
			return nil, fmt.Errorf("%w: %s", ErrChunkMissing, name)
		}
		doc = append(doc, data...)
	}
	if d := Digest(doc); d != m.Digest {
		return nil, fmt.Errorf("the chunks of generation %d make a document of digest %s, not the manifest's %s", m.Generation, d, m.Digest)
	}
	return doc, nil
}

// ChunkMatches tells whether a chunk's content is the one its name was made from.
func ChunkMatches(name string, data []byte) bool {
	sum := sha256.Sum256(data)
	h := hex.EncodeToString(sum[:])[:chunkHashLen]
	return len(name) > chunkHashLen && name[len(name)-chunkHashLen-1:] == "-"+h
}
