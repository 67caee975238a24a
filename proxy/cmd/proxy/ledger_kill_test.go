// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/pgserver"
)

// ledgerDoc is a standalone proxy with a priced model that records into the ledger
// at url, spooling to dir, flushing every second.
func ledgerDoc(upstream, url, dir string) string {
	sum := sha256.Sum256([]byte("sk-alice"))
	return fmt.Sprintf(`
upstreams: [{name: default, url: %q}]
models: [{name: gpt-4o, price: {input: 2, output: 10}}]
api_keys:
- {name: alice, key_sha256: %q, user: alice, team: research}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000000}
ledger: {url: %q, spool_dir: %q, flush_interval_seconds: 1}
`, upstream, hex.EncodeToString(sum[:]), url, dir)
}

// metric sums the samples of the series whose line starts with prefix in the proxy's
// /metrics.
func metric(t *testing.T, p *proxyProcess, prefix string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, prefix) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			sum += v
		}
	}
	return sum
}

// TestKilledProxyLosesOnlyWhatItHeldInMemory: a proxy process killed (SIGKILL) while
// its ledger database is down, with batches in its spool: the next process of the
// same pod replays the spool, and the ledger misses at most the settlements the
// killed one held in memory since its last flush (docs/ledger.md, "Durability, and
// its bound").
func TestKilledProxyLosesOnlyWhatItHeldInMemory(t *testing.T) {
	pg := pgserver.Start(t)
	url := pg.NewDatabase(t)
	backend := httptest.NewServer(fakellm.New())
	defer backend.Close()
	doc := ledgerDoc(backend.URL, url, filepath.Join(t.TempDir(), "spool"))
	pod := "POD_NAME=edge-proxy-0"

	first := startProxy(t, doc, pod)
	for range 5 {
		chat(t, first)
	}
	waitFor(t, "a flush", func() bool { return metric(t, first, `tokenwarden_ledger_batches_total{result="flushed"}`) >= 1 })
	if err := pg.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		chat(t, first)
	}
	waitFor(t, "the spool", func() bool {
		return metric(t, first, "tokenwarden_ledger_spool_batches") >= 1 && metric(t, first, `tokenwarden_ledger_batches_total{result="flushed"}`) >= 1
	})
	// Settled after the last flush: in memory when the process dies, the loss the
	// bound allows (at most one flush interval of settlements).
	inMemory := 3
	for range inMemory {
		chat(t, first)
	}
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.exited

	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	second := startProxy(t, doc, pod)
	waitFor(t, "the spool replayed", func() bool {
		return metric(t, second, "tokenwarden_ledger_spool_batches") == 0 && metric(t, second, `tokenwarden_ledger_batches_total{result="flushed"}`) >= 1
	})
	if n := metric(t, second, "tokenwarden_ledger_unrecorded_requests_total"); n != 0 {
		t.Errorf("the replay left %v requests unrecorded", n)
	}
	second.stop(t)

	sink, err := ledger.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	rows, err := sink.Report(context.Background(), ledger.Query{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)})
	if err != nil || len(rows) != 1 {
		t.Fatalf("report: %v, %v", rows, err)
	}
	got := rows[0].Requests
	if got < 10 || got > int64(10+inMemory) {
		t.Errorf("recorded %d requests: want the 10 flushed or spooled, and at most the %d held in memory", got, inMemory)
	}
	t.Logf("recorded %d of %d requests; lost %d, of at most %d held in memory", got, 10+inMemory, int64(10+inMemory)-got, inMemory)
}
