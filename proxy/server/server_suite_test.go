// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

func TestServer(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Proxy Server Suite")
}

func keyHash(k string) string {
	s := sha256.Sum256([]byte(k))
	return hex.EncodeToString(s[:])
}

// harness is one proxy in front of one fake backend, on an in-memory store and a fake
// clock.
type harness struct {
	llm     *fakellm.Server
	backend *httptest.Server
	clock   *storetest.Clock
	store   *budget.Memory
	reg     *prometheus.Registry
	m       *metrics.Metrics
	srv     *server.Server
	front   *httptest.Server
}

// newHarness starts a proxy with a config document; UPSTREAM in it is replaced by the
// fake backend's URL, and HASH(name) by the SHA-256 of the key "sk-name".
func newHarness(doc string) *harness {
	h := &harness{llm: fakellm.New(), clock: storetest.NewClock(), reg: prometheus.NewRegistry()}
	h.backend = httptest.NewServer(h.llm)
	DeferCleanup(h.backend.Close)
	h.store = budget.NewMemory(h.clock, 1000)
	h.m = metrics.New(h.reg)
	h.srv = server.New(server.Options{Store: h.store, Memory: h.store, Metrics: h.m, Clock: h.clock, Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil)),
		AccessLog: GinkgoWriter})
	_, err := h.srv.Apply([]byte(h.render(doc)), "test")
	Expect(err).NotTo(HaveOccurred())
	h.front = httptest.NewServer(h.srv)
	DeferCleanup(h.front.Close)
	return h
}

func (h *harness) render(doc string) string {
	doc = strings.ReplaceAll(doc, "UPSTREAM", h.backend.URL)
	for _, name := range []string{"alice", "bob", "carol", "root"} {
		doc = strings.ReplaceAll(doc, "HASH("+name+")", keyHash("sk-"+name))
	}
	return doc
}

func (h *harness) apply(doc string) error {
	_, err := h.srv.Apply([]byte(h.render(doc)), "test")
	return err
}

type reply struct {
	code   int
	header http.Header
	body   []byte
	json   map[string]any
}

func (r reply) errorField(path ...string) any {
	var v any = r.json
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func (h *harness) do(method, path, key string, body string, hdr ...string) reply {
	GinkgoHelper()
	return h.doAt(h.front.URL, method, path, key, body, hdr...)
}

// doAt sends a request to the proxy at base.
func (h *harness) doAt(base, method, path, key string, body string, hdr ...string) reply {
	GinkgoHelper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	r := reply{code: resp.StatusCode, header: resp.Header, body: b}
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		_ = json.Unmarshal(b, &r.json)
	}
	return r
}

// post sends a request to the proxy and returns the response unread.
func (h *harness) post(path, key, body string, hdr ...string) *http.Response {
	GinkgoHelper()
	req, err := http.NewRequest("POST", h.front.URL+path, strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	return resp
}

func (h *harness) chat(key string, maxTokens int, extra ...string) reply {
	GinkgoHelper()
	return h.chatAt(h.front.URL, key, maxTokens, extra...)
}

func (h *harness) chatAt(base, key string, maxTokens int, extra ...string) reply {
	GinkgoHelper()
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}],"max_tokens":` + itoa(maxTokens) + strings.Join(extra, "") + `}`
	return h.doAt(base, "POST", "/v1/chat/completions", key, body)
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// level is a bucket's level; an absent bucket is full at capacity.
func (h *harness) level(kind budget.Kind, dim budget.Dimension, id string, capacity float64) float64 {
	l, ok := h.store.Level(budget.Key{Kind: kind, Dim: dim, ID: id})
	if !ok {
		return capacity
	}
	return l
}

func counter(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// chatInput is the input estimate of h.chat's body: its keys (model 2, messages 2,
// role 1, content 2, max_tokens 3), its strings ("gpt-4o" 4: its digit is a run of
// its own; "user" 1, "hello there" 3), the ceiling's number (1) and the message's
// floor (4).
const chatInput = 2 + 2 + 1 + 2 + 3 + 4 + 1 + 3 + 1 + 4

// chatEstimate is the reservation of h.chat's body with the given ceiling.
func chatEstimate(maxTokens int) float64 { return float64(chatInput + maxTokens) }

var _ = context.Background

func fakellmUsage(in, out int64) fakellm.Behaviour {
	return fakellm.Behaviour{InputTokens: in, OutputTokens: out}
}

// fakellmZeroUsage answers after latency reporting no tokens used: each hold is
// refunded whole.
func fakellmZeroUsage(latency time.Duration) fakellm.Behaviour {
	return fakellm.Behaviour{Latency: latency}
}
