// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"hash/fnv"
	"hash/maphash"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// A change to a large fleet (one key added, changed or deleted) used to Encode the
// whole document (about 7 MB at 50,000 keys), cut it into chunks by size, so that a
// key added in the middle of the name order shifted every chunk after it, and hash
// every chunk again (issue 14). A chunked document is now laid out from each key's
// JSON line, encoded once while the key renders the same (keyFragment), and cut at
// keys chosen by their name (a chunk ends after a key whose name hashes to a multiple
// Of the number of such keys that make chunkTargetBytes), so a key added, changed or deleted changes only the chunk it is
// in: the others keep their bytes, their names, and their hashes, which are not
// computed again. The members after the keys and the generation are a chunk of their
// own (the tail). The bytes are those of config.Config.Render, whatever the cuts: the
// proxy puts the chunks back together and parses one document as before.

// chunkTargetBytes is the mean size of a chunk of keys: a chunk ends after a key whose
// name's FNV-1a hash is a multiple of the number of keys of its line's length that
// make this size (about 900 keys of short names). A chunk that would exceed
// config.MaxInline ends before (rare at this mean: about one chunk in 600).
const chunkTargetBytes = 128 << 10

// keyFragment is one key's JSON line, as Render writes it, and what tells the key it
// encodes: its name, the hash of its key (compared exactly: a rotated key is always
// encoded again) and a digest of the whole key (keyDigest), not a copy of it, which
// held about 200 bytes a key, 10 MB at 50,000 keys.
type keyFragment struct {
	name, keySHA256 string
	digest          uint64
	json            []byte
}

// fragmentSeed seeds the digests of keys, compared only within this process.
var fragmentSeed = maphash.MakeSeed()

// keyDigest is a 64-bit digest of every field of k. Two keys that differ share it
// with a chance of 2^-64 (the fragment then keeps its line until the key's next
// change); their key hashes are compared apart.
func keyDigest(k *config.APIKey) uint64 { return maphash.Comparable(fragmentSeed, *k) }

// encodes says whether f is the line of k.
func (f *keyFragment) encodes(k *config.APIKey) bool {
	return f.name == k.Name && f.keySHA256 == k.KeySHA256 && f.digest == keyDigest(k)
}

// keyChunk is a chunk of keys as laid out: its keys, whether it opens the document,
// its name and the hex SHA-256 of its text.
type keyChunk struct {
	frags []*keyFragment
	first bool
	name  string
	sum   string
}

// text is the chunk's bytes: the document's opening for the first chunk, else the
// separator after the previous chunk's last key; then the keys' lines.
func (c *keyChunk) text() []byte {
	n := len(docOpening)
	for _, f := range c.frags {
		n += len(f.json) + len(keySeparator)
	}
	b := make([]byte, 0, n)
	for i, f := range c.frags {
		if i == 0 && c.first {
			b = append(b, docOpening...)
		} else {
			b = append(b, keySeparator...)
		}
		b = append(b, f.json...)
	}
	return b
}

// writeTo writes the chunk's text to h, without making it.
func (c *keyChunk) writeTo(h hash.Hash) {
	for i, f := range c.frags {
		if i == 0 && c.first {
			h.Write([]byte(docOpening))
		} else {
			h.Write([]byte(keySeparator))
		}
		h.Write(f.json)
	}
}

// The bytes of Render around and between the keys.
const (
	docOpening   = "{\"api_keys\":[\n"
	keySeparator = ",\n"
	keysClosing  = "\n],\n"
)

// DocLayout is a fleet's memo of its chunked document: each key's fragment, by the
// key's rendered name, and the chunks of keys of the last layout, by their first key.
type DocLayout struct {
	frags  map[string]*keyFragment
	chunks map[*keyFragment]*keyChunk
}

// DocLayouts holds each fleet's DocLayout, by TokenProxy namespace and name. A fleet
// is reconciled by one worker at a time.
type DocLayouts struct{ m sync.Map }

// Of is the fleet's layout, made empty the first time.
func (l *DocLayouts) Of(fleet types.NamespacedName) *DocLayout {
	v, _ := l.m.LoadOrStore(fleet, &DocLayout{})
	return v.(*DocLayout)
}

// Forget drops the fleet's layout.
func (l *DocLayouts) Forget(fleet types.NamespacedName) { l.m.Delete(fleet) }

// LaidDoc is a rendered document laid out in chunks, at any generation.
type LaidDoc struct {
	prefix string
	keys   []*keyChunk
	// tail is what follows the keys up to the generation: the closing of the keys'
	// list and the other members.
	tail []byte
	// body is the SHA-256 state after every byte before the generation.
	body []byte
	size int
}

// Lay encodes the keys of cfg that the layout does not hold as they are, and lays the
// document out in chunks named after prefix. It returns nil when the document fits
// inline (config.MaxInline), or has no keys: such a document is encoded whole.
func (l *DocLayout) Lay(cfg *config.Config, prefix string) (*LaidDoc, error) {
	if len(cfg.APIKeys) == 0 {
		l.frags, l.chunks = nil, nil
		return nil, nil
	}
	shell := *cfg
	shell.APIKeys, shell.Generation = nil, 0
	sdoc, err := shell.Render()
	if err != nil {
		return nil, err
	}
	// sdoc is {<members>}\n.
	tail := make([]byte, 0, len(keysClosing)+len(sdoc))
	tail = append(tail, keysClosing...)
	tail = append(tail, sdoc[1:len(sdoc)-2]...)

	frags := make(map[string]*keyFragment, len(cfg.APIKeys))
	order := make([]*keyFragment, len(cfg.APIKeys))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	size := len(docOpening) + len(tail) + len("}\n")
	for i := range cfg.APIKeys {
		k := &cfg.APIKeys[i]
		f := l.frags[k.Name]
		if f == nil || !f.encodes(k) {
			buf.Reset()
			if err := enc.Encode(k); err != nil {
				return nil, err
			}
			f = &keyFragment{name: k.Name, keySHA256: k.KeySHA256, digest: keyDigest(k),
				json: bytes.Clone(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))}
		}
		frags[k.Name] = f
		order[i] = f
		size += len(f.json)
		if i > 0 {
			size += len(keySeparator)
		}
	}
	if size <= config.MaxInline {
		l.frags, l.chunks = nil, nil
		return nil, nil
	}

	d := &LaidDoc{prefix: prefix, tail: tail, size: size}
	chunks := make(map[*keyFragment]*keyChunk, len(l.chunks))
	h := sha256.New()
	var cur *keyChunk
	closeChunk := func() {
		if cur == nil {
			return
		}
		if old := l.chunks[cur.frags[0]]; old != nil && old.first == cur.first && slices.Equal(old.frags, cur.frags) {
			cur = old
		}
		if cur.sum == "" {
			sum := sha256.Sum256(cur.text())
			cur.sum = hex.EncodeToString(sum[:])
			cur.name = prefix + "-" + cur.sum[:16]
		}
		cur.writeTo(h)
		chunks[cur.frags[0]] = cur
		d.keys = append(d.keys, cur)
		cur = nil
	}
	curSize := 0
	for i, f := range order {
		if cur != nil && curSize+len(keySeparator)+len(f.json) > config.MaxInline {
			closeChunk()
		}
		if cur == nil {
			cur = &keyChunk{first: i == 0}
			curSize = len(docOpening) - len(keySeparator)
		}
		cur.frags = append(cur.frags, f)
		curSize += len(keySeparator) + len(f.json)
		if chunkEndsAfter(f) {
			closeChunk()
		}
	}
	closeChunk()
	h.Write(tail)
	if d.body, err = h.(encoding.BinaryMarshaler).MarshalBinary(); err != nil {
		return nil, err
	}
	l.frags, l.chunks = frags, chunks
	return d, nil
}

// chunkEndsAfter tells whether a chunk ends after this key: by its name, so that a
// key added or deleted elsewhere moves no chunk's end.
func chunkEndsAfter(f *keyFragment) bool {
	h := fnv.New32a()
	_, _ = h.Write([]byte(f.name))
	every := max(chunkTargetBytes/uint32(len(f.json)+len(keySeparator)), 1)
	return h.Sum32()%every == 0
}

// ending is the document's last bytes at generation g, as Render writes them.
func ending(g int64) []byte {
	if g == 0 {
		return []byte("}\n")
	}
	return fmt.Appendf(nil, ",\n\"generation\":%d}\n", g)
}

// Digest is the config.Digest of the document at generation g, without hashing the
// bytes before the generation again.
func (d *LaidDoc) Digest(g int64) (string, error) {
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(d.body); err != nil {
		return "", err
	}
	return sumOf(h, ending(g)), nil
}

func sumOf(h hash.Hash, last []byte) string {
	h.Write(last)
	return hex.EncodeToString(h.Sum(nil))
}

// DocChunk is one chunk of a laid out document: its name, the hex SHA-256 of its text,
// and its text, made when asked for.
type DocChunk struct {
	Name string
	Sum  string
	Text func() []byte
}

// Chunks are the document's chunks at generation g, in order: the keys' chunks, then
// the tail with the generation (cut at line breaks should it exceed
// config.MaxInline).
func (d *LaidDoc) Chunks(g int64) []DocChunk {
	out := make([]DocChunk, 0, len(d.keys)+1)
	for _, c := range d.keys {
		out = append(out, DocChunk{Name: c.name, Sum: c.sum, Text: c.text})
	}
	tail := append(slices.Clone(d.tail), ending(g)...)
	parts, _ := config.Split(tail, g, d.prefix, config.MaxInline)
	for _, p := range parts {
		sum := sha256.Sum256(p.Data)
		out = append(out, DocChunk{Name: p.Name, Sum: hex.EncodeToString(sum[:]), Text: func() []byte { return p.Data }})
	}
	return out
}

// Manifest is the document's manifest at generation g.
func (d *LaidDoc) Manifest(g int64, chunks []DocChunk) (*config.Manifest, error) {
	digest, err := d.Digest(g)
	if err != nil {
		return nil, err
	}
	m := &config.Manifest{Generation: g, Digest: digest, Size: int64(d.size + len(ending(g)) - len("}\n"))}
	for _, c := range chunks {
		m.Chunks = append(m.Chunks, c.Name)
	}
	return m, nil
}
