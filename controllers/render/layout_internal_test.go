// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// layoutConfig is a document of n keys (names k00000...), too large to stay inline
// from about 6,000 keys on.
func layoutConfig(n int, skip ...int) *config.Config {
	c := &config.Config{Listen: "0.0.0.0:8080", Upstreams: []config.Upstream{{Name: "u", URL: "http://u"}}}
	for i := range n {
		if slices.Contains(skip, i) {
			continue
		}
		c.APIKeys = append(c.APIKeys, config.APIKey{Name: fmt.Sprintf("k%05d", i), KeySHA256: fmt.Sprintf("%064x", i),
			Team: "team-<a>", RateLimit: 10})
	}
	return c
}

// assembled is the document the proxy puts together from a layout's chunks, and the
// Chunks' names.
func assembled(t *testing.T, d *LaidDoc, g int64) ([]byte, []string) {
	t.Helper()
	chunks := d.Chunks(g)
	m, err := d.Manifest(g, chunks)
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string][]byte{}
	for _, c := range chunks {
		text := c.Text()
		if len(text) > config.MaxInline {
			t.Fatalf("chunk %s holds %d bytes, more than %d", c.Name, len(text), config.MaxInline)
		}
		if !config.ChunkMatches(c.Name, text) || !HoldsChunkSum(slimChunk(t, c.Name, text), c.Sum) {
			t.Fatalf("chunk %s is not named after its text", c.Name)
		}
		texts[c.Name] = text
	}
	doc, err := m.Assemble(func(name string) ([]byte, bool) { b, ok := texts[name]; return b, ok })
	if err != nil {
		t.Fatal(err)
	}
	if m.Size != int64(len(doc)) {
		t.Fatalf("the manifest says %d bytes, the document has %d", m.Size, len(doc))
	}
	return doc, m.Chunks
}

// TestLayoutIsRender: the chunks of a laid out document put together are Render's
// bytes at every generation, which the proxy parses; an added, changed or deleted key
// changes only the chunk it is in (and the tail, which holds the generation).
func TestLayoutIsRender(t *testing.T) {
	var l DocLayout
	cfg := layoutConfig(12000)
	d, err := l.Lay(cfg, "fleet-proxy")
	if err != nil || d == nil {
		t.Fatalf("no layout (%v)", err)
	}
	for _, g := range []int64{0, 1, 42} {
		doc, _ := assembled(t, d, g)
		cfg.Generation = g
		want, err := cfg.Render()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(doc, want) {
			t.Fatalf("generation %d: the chunks make another document than Render", g)
		}
		parsed, err := config.Parse(doc)
		if err != nil || len(parsed.APIKeys) != 12000 {
			t.Fatalf("the proxy does not parse the document: %v", err)
		}
	}
	_, before := assembled(t, d, 7)
	if len(before) < 5 {
		t.Fatalf("12,000 keys in %d chunks: the keys are not cut by name", len(before))
	}

	g := int64(7)
	changed := func(what string, c *config.Config, wantNew int) {
		t.Helper()
		g++
		d, err := l.Lay(c, "fleet-proxy")
		if err != nil {
			t.Fatal(err)
		}
		c.Generation = g
		doc, after := assembled(t, d, g)
		if want, _ := c.Render(); !bytes.Equal(doc, want) {
			t.Fatalf("%s: the chunks make another document than Render", what)
		}
		var fresh []string
		for _, n := range after {
			if !slices.Contains(before, n) {
				fresh = append(fresh, n)
			}
		}
		// The tail, with the generation, and the chunks of keys that changed.
		if len(fresh) != wantNew+1 {
			t.Fatalf("%s: %d new chunks of %d, want %d", what, len(fresh), len(after), wantNew+1)
		}
		before = after
	}
	// One more key in the middle of the name order.
	added := layoutConfig(12000)
	added.APIKeys = slices.Insert(added.APIKeys, 6000, config.APIKey{Name: "k05999a", KeySHA256: fmt.Sprintf("%064x", 99999)})
	changed("a key added", added, 1)
	added.APIKeys[3000].RateLimit = 99
	changed("a key changed", added, 1)
	added.APIKeys = slices.Delete(added.APIKeys, 9000, 9001)
	changed("a key deleted", added, 1)
	if !bytes.Contains(mustRender(t, added), []byte(`"rate_limit":99`)) {
		t.Fatal("the changed limit is not in the document")
	}

	// A document that fits inline is not laid out.
	if d, _ := l.Lay(layoutConfig(100), "fleet-proxy"); d != nil {
		t.Fatal("a small document was laid out in chunks")
	}
}

func mustRender(t *testing.T, c *config.Config) []byte {
	t.Helper()
	doc, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// slimChunk is a chunk's ConfigMap as the cache holds it.
func slimChunk(t *testing.T, name string, text []byte) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{ChunkOfLabel: "fleet-proxy"}},
		Data: map[string]string{config.ChunkKey: string(text)}}
	o, err := SlimConfigMap(cm)
	if err != nil {
		t.Fatal(err)
	}
	return o.(*corev1.ConfigMap)
}

// BenchmarkOneKeyAdded is the config step's document work for one key added to a
// 50,000-key fleet (and removed again, alternately): whole, as before the layout
// (Encode, digest, split by size, hash every chunk to compare it with the cache), and
// laid out key by key.
func BenchmarkOneKeyAdded(b *testing.B) {
	with, without := layoutConfig(50000), layoutConfig(50000, 25000)
	b.Run("whole", func(b *testing.B) {
		for i := range b.N {
			cfg := []*config.Config{with, without}[i%2]
			enc, err := NewEncoder(cfg)
			if err != nil {
				b.Fatal(err)
			}
			doc, _ := enc.At(int64(i))
			_ = config.Digest(doc)
			chunks, _ := config.Split(doc, int64(i), "fleet-proxy", config.MaxInline)
			for _, c := range chunks {
				_ = SplitChunk(c)
			}
		}
	})
	b.Run("laid", func(b *testing.B) {
		var l DocLayout
		for i := range b.N {
			cfg := []*config.Config{with, without}[i%2]
			d, err := l.Lay(cfg, "fleet-proxy")
			if err != nil {
				b.Fatal(err)
			}
			_, _ = d.Digest(int64(i))
			_ = d.Chunks(int64(i))
		}
	})
}

// TestLayoutHeldBytes: the layout a fleet keeps between reconciles holds each key's
// line and little more, beside the strings it shares with the config (the cache's):
// with a copy of each rendered key it held about 200 bytes a key more, 10 MB at
// 50,000 keys.
func TestLayoutHeldBytes(t *testing.T) {
	const keys = 20000
	cfg := layoutConfig(keys)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	var l DocLayout
	if _, err := l.Lay(cfg, "fleet-proxy"); err != nil {
		t.Fatal(err)
	}
	after := heap()
	runtime.KeepAlive(cfg)
	runtime.KeepAlive(&l)
	line := len(mustLine(t, &cfg.APIKeys[0]))
	perKey := float64(after-before) / keys
	t.Logf("the layout holds %.0f bytes a key (its line %d bytes)", perKey, line)
	if most := float64(line) + 160; perKey > most {
		t.Errorf("the layout holds %.0f bytes a key, want at most %.0f (the line and 160 bytes)", perKey, most)
	}
}

// mustLine is the JSON line of k.
func mustLine(t *testing.T, k *config.APIKey) []byte {
	t.Helper()
	b, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
