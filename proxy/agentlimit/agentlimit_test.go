// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package agentlimit_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/agentlimit"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// limits returns Limits keeping maxRuns runs for idle seconds.
func limits(maxRuns, idle int64) *agentlimit.Limits {
	l := &agentlimit.Limits{}
	l.Configure(&config.Config{Agents: config.Agents{MaxRuns: maxRuns, RunIdleSeconds: idle}})
	return l
}

func runHeader(id string) http.Header {
	h := http.Header{}
	h.Set(config.RunHeader, id)
	return h
}

// code is a refusal's code, or "" when the request was admitted.
func code(ref *agentlimit.Refusal) string {
	if ref == nil {
		return ""
	}
	return ref.Code
}

func TestInFlightLimitUntilOneEnds(t *testing.T) {
	l := limits(0, 0)
	k := agentlimit.Key{MaxInFlight: 2}
	var a, b, c agentlimit.Request
	c.Class = schedule.Batch
	for _, r := range []*agentlimit.Request{&a, &b} {
		if ref := l.Admit(r, storetest.NewClock(), http.Header{}, "alice", k, 10); ref != nil {
			t.Fatalf("request within the limit refused: %+v", ref)
		}
	}
	ref := l.Admit(&c, storetest.NewClock(), http.Header{}, "alice", k, 10)
	if code(ref) != "in_flight_limit" || ref.Status != http.StatusTooManyRequests || ref.LimitType != "in_flight" ||
		ref.Header != "Retry-After" || ref.Value != "1" || ref.Details["max_in_flight"] != int64(2) || ref.Details["class"] != "batch" {
		t.Fatalf("third request in flight: %+v", ref)
	}
	var other agentlimit.Request
	if ref := l.Admit(&other, storetest.NewClock(), http.Header{}, "bob", k, 10); ref != nil {
		t.Fatalf("another key is limited by alice's requests: %+v", ref)
	}
	l.End(&a)
	if ref := l.Admit(&c, storetest.NewClock(), http.Header{}, "alice", k, 10); ref != nil {
		t.Fatalf("a request ended, yet the next is refused: %+v", ref)
	}
}

func TestRunStepsTokensIdleAndBound(t *testing.T) {
	l := limits(3, 60)
	clock := storetest.NewClock()
	bob := agentlimit.Key{RunTokens: 300, RunSteps: 3}
	carol := agentlimit.Key{RunTokens: 300, RunSteps: 10}
	take := func(name string, k agentlimit.Key, id string, cost, used int64) *agentlimit.Refusal {
		var r agentlimit.Request
		ref := l.Admit(&r, clock, runHeader(id), name, k, cost)
		if ref == nil {
			l.Settle(&r, used)
			l.End(&r)
		}
		return ref
	}
	for range 3 {
		if ref := take("bob", bob, "r1", 61, 100); ref != nil {
			t.Fatalf("step within the run's limits refused: %+v", ref)
		}
	}
	ref := take("bob", bob, "r1", 61, 100)
	if code(ref) != "run_steps_exceeded" || ref.Header != "X-Should-Retry" || ref.Value != "false" || ref.Details["run_steps"] != int64(3) {
		t.Fatalf("fourth step: %+v", ref)
	}
	// The same run id under another key is that key's own run.
	for range 2 {
		if ref := take("carol", carol, "r1", 61, 100); ref != nil {
			t.Fatalf("carol's run refused: %+v", ref)
		}
	}
	if ref := take("carol", carol, "r1", 66, 100); ref != nil {
		t.Fatalf("200 spent + 66 reserved fits 300: %+v", ref)
	}
	ref = take("carol", carol, "r1", 61, 100)
	if code(ref) != "run_budget_exceeded" || ref.LimitType != "run" || ref.Details["run_tokens_spent"] != int64(300) || ref.Details["reason"] != "run_budget_exceeded" {
		t.Fatalf("run past its tokens: %+v", ref)
	}
	// A run idle past the idle time is forgotten: it starts over.
	clock.Advance(61 * time.Second)
	if ref := take("carol", carol, "r1", 61, 100); ref != nil {
		t.Fatalf("idle run not forgotten: %+v", ref)
	}
	if l.Runs() != 1 {
		t.Fatalf("runs kept: %d, want 1", l.Runs())
	}
	// The runs kept are bounded: the least recently seen is forgotten.
	for _, id := range []string{"r2", "r3", "r4"} {
		if ref := take("bob", bob, id, 61, 100); ref != nil {
			t.Fatalf("run %s refused: %+v", id, ref)
		}
	}
	if l.Runs() != 3 {
		t.Fatalf("runs kept: %d, want 3", l.Runs())
	}
}

func TestRunGetsBackWhatARequestThatRanNothingReserved(t *testing.T) {
	l := limits(0, 0)
	clock := storetest.NewClock()
	bob := agentlimit.Key{RunTokens: 300, RunSteps: 3}
	for range 5 {
		var r agentlimit.Request
		if ref := l.Admit(&r, clock, runHeader("r1"), "bob", bob, 61); ref != nil {
			t.Fatalf("refused: %+v", ref)
		}
		l.Release(&r)
		l.End(&r)
	}
	var r agentlimit.Request
	if ref := l.Admit(&r, clock, runHeader("r1"), "bob", bob, 61); ref != nil {
		t.Fatalf("requests that ran nothing counted steps or tokens: %+v", ref)
	}
	if ref := l.Admit(&r, clock, runHeader(strings.Repeat("x", 300)), "bob", bob, 61); code(ref) != "invalid_run_id" || ref.Status != http.StatusBadRequest {
		t.Fatalf("a run id too long: %+v", ref)
	}
}

func TestRunIDObeysTheAttributeHeadersBounds(t *testing.T) {
	l := limits(0, 0)
	clock := storetest.NewClock()
	bob := agentlimit.Key{RunTokens: 300, RunSteps: 3}
	for name, h := range map[string]http.Header{
		"a space":         runHeader("run 1"),
		"a control byte":  runHeader("run\x01"),
		"a non-ASCII one": runHeader("r\u00e9sum\u00e9"),
		"sent twice":      {config.RunHeader: {"r1", "r2"}},
	} {
		var r agentlimit.Request
		ref := l.Admit(&r, clock, h, "bob", bob, 61)
		if code(ref) != "invalid_run_id" || ref.Status != http.StatusBadRequest || !strings.Contains(ref.Message, config.RunHeader) {
			t.Errorf("a run id with %s: %+v", name, ref)
		}
	}
	var r agentlimit.Request
	if ref := l.Admit(&r, clock, runHeader("planner-7/step.3"), "bob", bob, 61); ref != nil {
		t.Fatalf("visible ASCII refused: %+v", ref)
	}
}

func TestClassOfIsLoweredNeverRaised(t *testing.T) {
	h := http.Header{}
	h.Set(config.PriorityHeader, " Background ")
	if c := agentlimit.ClassOf(h, schedule.Batch); c != schedule.Background {
		t.Fatalf("lowered to background: %v", c)
	}
	h.Set(config.PriorityHeader, "interactive")
	if c := agentlimit.ClassOf(h, schedule.Batch); c != schedule.Batch {
		t.Fatalf("raised by the header: %v", c)
	}
}

// capped applies a cap of 50 to body on the chat route.
func capped(t *testing.T, over config.OverAction, body string) (map[string]any, *agentlimit.Refusal) {
	t.Helper()
	est, err := estimate.Body([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	lim := config.ClassLimits{MaxOutputTokens: 50, OverMaxOutputTokens: over}
	out, outEst, ref := agentlimit.CapOutput(lim, schedule.Batch, "/v1/chat/completions", []byte(body), est)
	if ref != nil || out == nil {
		return nil, ref
	}
	if outEst.Output != 50 {
		t.Fatalf("the rewritten body reserves %d output tokens, want the cap's 50", outEst.Output)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("rewritten body %s: %v", out, err)
	}
	return m, nil
}

func TestCapOutputClampsInsertsOrRefuses(t *testing.T) {
	if m, _ := capped(t, "", `{"model":"gpt-4o","max_tokens":900,"messages":[]}`); m["max_tokens"] != 50.0 || m["model"] != "gpt-4o" {
		t.Fatalf("clamped: %v", m)
	}
	if m, _ := capped(t, "", `{"model":"gpt-4o","messages":[]}`); m["max_completion_tokens"] != 50.0 {
		t.Fatalf("no limit gets the cap in the route's field: %v", m)
	}
	if m, ref := capped(t, "", `{"model":"gpt-4o","max_tokens":20}`); m != nil || ref != nil {
		t.Fatalf("a request within the cap is rewritten: %v %+v", m, ref)
	}
	_, ref := capped(t, config.OverRefuse, `{"model":"gpt-4o","max_tokens":100}`)
	if code(ref) != "max_tokens_above_class_cap" || ref.Status != http.StatusBadRequest ||
		!strings.Contains(ref.Message, "max_tokens is 100, above the batch class's cap of 50") {
		t.Fatalf("refused: %+v", ref)
	}
}

func TestSetBodyForwardsPlain(t *testing.T) {
	r, _ := http.NewRequest(http.MethodPost, "http://x/v1/chat/completions", strings.NewReader("zzz"))
	r.Header.Set("Content-Encoding", "gzip")
	agentlimit.SetBody(r, []byte(`{"max_tokens":50}`))
	if r.Header.Get("Content-Encoding") != "" || r.ContentLength != 17 || r.Header.Get("Content-Length") != "17" {
		t.Fatalf("headers after the rewrite: %v, length %d", r.Header, r.ContentLength)
	}
	for _, body := range []func() (io.ReadCloser, error){func() (io.ReadCloser, error) { return r.Body, nil }, r.GetBody} {
		rc, _ := body()
		if b, _ := io.ReadAll(rc); string(b) != `{"max_tokens":50}` {
			t.Fatalf("body sent: %q", b)
		}
	}
}

// TestCapOutputEstimatesTheRewriteAsTheBodyWould: the estimate a cap's rewrite returns
// is the one a scan of the rewritten body gives, every field of it, however many
// output limits the body states; and a tokenizer's count stands through the rewrite.
func TestCapOutputEstimatesTheRewriteAsTheBodyWould(t *testing.T) {
	lim := config.ClassLimits{MaxOutputTokens: 50}
	for _, c := range []struct{ route, body string }{
		{"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":900,"messages":[{"role":"user","content":"hello there"}]}`},
		{"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}],"n":3}`},
		{"/v1/chat/completions", `{}`},
		{"/v1/chat/completions", `{ "max_tokens" : 123456789 , "max_completion_tokens": 40, "model":"m"}`},
		{"/v1/chat/completions", `{"max_tokens":900,"max_tokens":"7000.5","messages":[]}`},
		{"/v1/chat/completions", `{"max\u005ftokens":900,"messages":[]}`},
		{"/v1/chat/completions", `{"max_tokens":1e400,"best_of":2,"n":1}`},
		{"/v1/completions", `{"model":"m","prompt":["a","b","c"],"max_tokens":1000}`},
		{"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":9000,"stream":true}`},
		{"/v1/messages", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		// More output limits than the estimate keeps in place.
		{"/v1/chat/completions", `{"max_tokens":900,"max_tokens":800,"max_tokens":700,"max_tokens":600}`},
		// The model after the limits, given twice, escaped, and nested in a message.
		{"/v1/chat/completions", `{"max_tokens":90000,"model":"a","messages":[{"model":"x"}],"mod\u0065l":"b","max_tokens":70}`},
		{"/v1/responses", `{"input":"hi", "model" : "m","store":false}`},
	} {
		est, err := estimate.Body([]byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		out, got, ref := agentlimit.CapOutput(lim, schedule.Batch, c.route, []byte(c.body), est)
		if ref != nil || out == nil {
			t.Fatalf("%s: not rewritten (%+v)", c.body, ref)
		}
		want, err := estimate.Body(out)
		if err != nil {
			t.Fatal(err)
		}
		if got.Input != want.Input || got.Output != want.Output || got.InputLower != want.InputLower ||
			got.OutputCap != want.OutputCap || got.Model != want.Model || got.Stream != want.Stream || !got.Parsed {
			t.Errorf("%s, rewritten %s: estimate %+v, the rewritten body's %+v", c.body, out, got, want)
		}
		if got.State != want.State {
			t.Errorf("%s: state %+v, the rewritten body's %+v", c.body, got.State, want.State)
		}
		// The rename after the rewrite replaces the rewritten body's model values.
		renamed, ok := got.Renamed(out, "provider-model")
		if wantRenamed, _ := want.Renamed(out, "provider-model"); !ok || string(renamed) != string(wantRenamed) {
			t.Errorf("%s: renamed after the rewrite %s, want %s", c.body, renamed, wantRenamed)
		}
		est.Tokenize(1234, 1000)
		_, got, _ = agentlimit.CapOutput(lim, schedule.Batch, c.route, []byte(c.body), est)
		if got.Input != 1234 || got.InputLower != 1000 || got.Output != want.Output {
			t.Errorf("%s: a tokenizer's count through the rewrite: %+v", c.body, got)
		}
	}
}
