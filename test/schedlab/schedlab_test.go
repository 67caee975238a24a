// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package schedlab_test reproduces, at small scale, the shape of mission three of the
// token rate limiting lab: a batch tenant keeps a backend busy while a chat tenant
// sends short interactive requests. With first-in-first-out the chat requests wait
// behind the batch prompts; with the proxy's scheduler (a capacity on the upstream and
// the chat key in the interactive class) they overtake them while batch keeps the
// backend full.
//
// The backend has four slots and takes a time linear in the request's tokens; the
// proxy is the real handler in front of it. `make bench-schedule` runs each mode for
// SCHEDLAB_SECONDS (default 20) and prints BENCH lines; without it the test is a
// short smoke that checks the shape.
package schedlab_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

// The world, chosen for a short run on a small machine.
const (
	slots          = 4                     // the backend's concurrent requests
	perToken       = 20 * time.Microsecond // the backend's time per token
	batchClients   = 8                     // batch requests kept outstanding
	batchInput     = 4000                  // tokens per batch prompt
	batchOutput    = 200                   // output tokens per batch answer
	chatInput      = 300
	chatOutput     = 100
	chatInterval   = 40 * time.Millisecond // one chat request every interval
	chatTargetWait = 50 * time.Millisecond // "starts within": the scaled 2 seconds
)

// backend is four slots taken in arrival order; each request holds one for a time
// linear in its tokens, then the fake LLM answers with that usage.
func backend() http.Handler {
	llm := fakellm.New()
	sem := make(chan struct{}, slots)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, _ := strconv.Atoi(r.Header.Get("X-Lab-Input"))
		out, _ := strconv.Atoi(r.Header.Get("X-Lab-Output"))
		sem <- struct{}{}
		time.Sleep(time.Duration(in+out) * perToken) // the simulated step time
		<-sem
		b, _ := json.Marshal(fakellm.Behaviour{InputTokens: int64(in), OutputTokens: int64(out)})
		r.Header.Set(fakellm.HeaderBehaviour, string(b))
		llm.ServeHTTP(w, r)
	})
}

func hash(k string) string {
	s := sha256.Sum256([]byte(k))
	return hex.EncodeToString(s[:])
}

type result struct {
	chatWaits   []time.Duration // time beyond the chat request's own step time
	batchTokens int64
	elapsed     time.Duration
}

func run(t *testing.T, scheduled bool, d time.Duration) result {
	be := httptest.NewServer(backend())
	defer be.Close()
	capacity := ""
	if scheduled {
		capacity = fmt.Sprintf(", capacity: {max_in_flight_requests: %d}", slots)
	}
	doc := `
upstreams: [{name: backend, url: ` + be.URL + capacity + `}]
api_keys:
- {name: chat, key_sha256: ` + hash("sk-chat") + `, priority: interactive}
- {name: batch, key_sha256: ` + hash("sk-batch") + `, priority: batch}
`
	store := budget.NewMemory(budget.SystemClock{}, 1000)
	srv := server.New(server.Options{Store: store, Memory: store, Metrics: metrics.New(prometheus.NewRegistry()),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AccessLog: io.Discard})
	if _, err := srv.Apply([]byte(doc), "lab"); err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(srv)
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	call := func(key string, in, out int) error {
		body := `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":` + strconv.Itoa(out) + `}`
		req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Lab-Input", strconv.Itoa(in))
		req.Header.Set("X-Lab-Output", strconv.Itoa(out))
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}

	var res result
	var batchTokens atomic.Int64
	var mu sync.Mutex
	var errs []error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range batchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := call("sk-batch", batchInput, batchOutput); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				batchTokens.Add(batchInput + batchOutput)
			}
		}()
	}
	start := time.Now()
	tick := time.NewTicker(chatInterval)
	defer tick.Stop()
	var chat sync.WaitGroup
	for time.Since(start) < d {
		<-tick.C
		chat.Add(1)
		go func() {
			defer chat.Done()
			began := time.Now()
			if err := call("sk-chat", chatInput, chatOutput); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			wait := time.Since(began) - time.Duration(chatInput+chatOutput)*perToken
			mu.Lock()
			res.chatWaits = append(res.chatWaits, wait)
			mu.Unlock()
		}()
	}
	chat.Wait()
	res.elapsed = time.Since(start)
	res.batchTokens = batchTokens.Load()
	close(stop)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs[0])
	}
	slices.Sort(res.chatWaits)
	return res
}

func (r result) quantile(q float64) time.Duration {
	if len(r.chatWaits) == 0 {
		return 0
	}
	return r.chatWaits[min(len(r.chatWaits)-1, int(q*float64(len(r.chatWaits))))]
}

func (r result) within(target time.Duration) float64 {
	n := 0
	for _, w := range r.chatWaits {
		if w <= target {
			n++
		}
	}
	return float64(n) / float64(max(1, len(r.chatWaits)))
}

func TestMissionThreeShape(t *testing.T) {
	d := 2 * time.Second
	if s := os.Getenv("SCHEDLAB_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("SCHEDLAB_SECONDS: %v", err)
		}
		d = time.Duration(n) * time.Second
	}
	got := map[bool]result{}
	for _, scheduled := range []bool{false, true} {
		r := run(t, scheduled, d)
		got[scheduled] = r
		mode := "fifo"
		if scheduled {
			mode = "scheduled"
		}
		capTokens := float64(slots) / perToken.Seconds()
		fmt.Printf("BENCH schedlab mode=%s chat_requests=%d chat_wait_p50=%s chat_wait_p99=%s chat_within_target=%.1f%% batch_tokens_per_second=%.0f backend_capacity_tokens_per_second=%.0f\n",
			mode, len(r.chatWaits), r.quantile(0.5).Round(time.Millisecond), r.quantile(0.99).Round(time.Millisecond),
			100*r.within(chatTargetWait), float64(r.batchTokens)/r.elapsed.Seconds(), capTokens)
	}
	fifo, sched := got[false], got[true]
	if sched.within(chatTargetWait) <= fifo.within(chatTargetWait) {
		t.Errorf("the scheduler did not bring chat requests forward: %.0f%% within target against %.0f%% first-in-first-out",
			100*sched.within(chatTargetWait), 100*fifo.within(chatTargetWait))
	}
	if sched.batchTokens*2 < fifo.batchTokens {
		t.Errorf("batch throughput fell to %d tokens from %d: the scheduler should keep the backend full", sched.batchTokens, fifo.batchTokens)
	}
}
