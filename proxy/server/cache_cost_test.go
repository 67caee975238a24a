// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
)

// maxMissAllocs is what a request the response cache misses may cost over the same
// request with the cache off: the coalescing call, its upstream context (the
// context.WithCancel, its cancel function, its Done channel and the transport's
// registration with it, less the value context it replaces), the recorded answer and
// the stored entry, with one to spare for the store's map as it grows.
const maxMissAllocs = 8

// TestACacheMissCostsAFewAllocations: the same requests, each with a new body, cost at
// most maxMissAllocs allocations more each with the response cache configured (every
// one a miss, coalesced with none and stored) than with it off.
func TestACacheMissCostsAFewAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("counts allocations of whole requests")
	}
	backend := benchBackend()
	defer backend.Close()
	allocs := func(doc, want string) float64 {
		srv := server.New(server.Options{Store: budget.NewMemory(budget.SystemClock{}, 1000000),
			Metrics: metrics.New(prometheus.NewRegistry()), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard})
		doc = strings.NewReplacer("UPSTREAM", backend.URL, "HASH", keyHash("sk-alice")).Replace(doc)
		if _, err := srv.Apply([]byte(doc), "test"); err != nil {
			t.Fatal(err)
		}
		n := 0
		return testing.AllocsPerRun(500, func() {
			n++
			body := strings.Replace(benchRequest, "three sentences", "three sentences ("+strconv.Itoa(n)+")", 1)
			req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer sk-alice")
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, req)
			if w.Code != 200 || w.Header().Get("X-Tokenwarden-Cache") != want {
				t.Fatalf("status %d, cache %q (want %q): %s", w.Code, w.Header().Get("X-Tokenwarden-Cache"), want, w.Body)
			}
		})
	}
	off := allocs(benchDoc, "")
	miss := allocs(benchDoc+"cache: {storage: memory}\n", "miss")
	t.Logf("allocations a request: %.1f with the cache off, %.1f when it misses", off, miss)
	if miss-off > maxMissAllocs {
		t.Errorf("a miss costs %.1f allocations more than the cache off (%.1f against %.1f), more than %d",
			miss-off, miss, off, maxMissAllocs)
	}
}

// TestALeaderKeepsItsOwnAnswer: a request that leads a coalescing call and gets an
// answer it cannot share (an error, or a coding the proxy cannot read) reads the
// whole of it from the upstream: ending the call does not end the upstream call.
func TestALeaderKeepsItsOwnAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a proxy and a backend")
	}
	for _, c := range []struct {
		name   string
		status int
		header string
	}{{"an error", http.StatusInternalServerError, ""}, {"an unreadable coding", http.StatusOK, "br"}} {
		t.Run(c.name, func(t *testing.T) {
			release := make(chan struct{})
			body := strings.Repeat(`{"error":{"message":"the upstream's own answer"}}`, 200)
			backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				if c.header != "" {
					w.Header().Set("Content-Encoding", c.header)
				}
				w.WriteHeader(c.status)
				w.(http.Flusher).Flush()
				<-release // the body comes once the proxy has the answer's head
				_, _ = w.Write([]byte(body))
			}))
			defer backend.Close()
			srv := server.New(server.Options{Store: budget.NewMemory(budget.SystemClock{}, 1000000),
				Metrics: metrics.New(prometheus.NewRegistry()), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard})
			doc := strings.NewReplacer("UPSTREAM", backend.URL, "HASH", keyHash("sk-alice")).Replace(benchDoc + "cache: {storage: memory}\n")
			if _, err := srv.Apply([]byte(doc), "test"); err != nil {
				t.Fatal(err)
			}
			front := httptest.NewServer(srv)
			defer front.Close()
			req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(benchRequest))
			req.Header.Set("Authorization", "Bearer sk-alice")
			req.Header.Set("Accept-Encoding", "identity")
			resp, err := http.DefaultTransport.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			close(release)
			got, err := io.ReadAll(resp.Body)
			if resp.StatusCode != c.status || err != nil || string(got) != body {
				t.Errorf("status %d (want %d), %d of %d bytes, error %v", resp.StatusCode, c.status, len(got), len(body), err)
			}
		})
	}
}
