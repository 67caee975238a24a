// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/otlpreceiver"
)

var (
	buildOnce sync.Once
	builtPath string
	buildErr  error
)

// proxyBinary builds this command once per test run, into a directory removed when
// the process exits.
func proxyBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tokenwarden-proxy-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtPath = filepath.Join(dir, "proxy")
		out, err := exec.Command("go", "build", "-o", builtPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtPath
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// proxyProcess is the proxy binary running on a config document.
type proxyProcess struct {
	url string
	// admin is the admin listener's address; path is the config document's file.
	admin, path string
	cmd         *exec.Cmd
	log         *lockedBuffer
	exited      chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startProxy runs the binary on doc with env added to the test's environment, and
// returns once it is ready.
func startProxy(t *testing.T, doc string, env ...string) *proxyProcess {
	t.Helper()
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	listen, admin := freeAddr(t), freeAddr(t)
	p := &proxyProcess{url: "http://" + listen, admin: admin, path: path, log: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(proxyBinary(t), "--config", path, "--listen", listen, "--admin-listen", admin, "--drain-delay", "0s")
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("proxy output:\n%s", p.log.String())
		}
	})
	waitFor(t, "the proxy to be ready", func() bool {
		select {
		case <-p.exited:
			t.Fatalf("the proxy exited:\n%s", p.log.String())
		default:
		}
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// stop sends SIGTERM and waits for the proxy to exit.
func (p *proxyProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the proxy to exit", func() bool {
		select {
		case <-p.exited:
			return true
		default:
			return false
		}
	})
}

// waitFor polls until ok holds, for at most a minute: a loaded machine is slow, not
// wrong.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

const (
	clientTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientParent = "00f067aa0ba902b7"
)

// tracedDoc is a proxy in front of upstream with one key, sk-alice, and the given
// observability.tracing block.
func tracedDoc(upstream, tracing string) string {
	sum := sha256.Sum256([]byte("sk-alice"))
	return fmt.Sprintf(`
upstreams: [{name: default, url: %q}]
auth: {mode: required}
api_keys:
- {name: alice, key_sha256: %q, user: alice, team: research}
rate_limiting:
  budget_division: {replicas: 1}
  limits:
    per_api_key: {tokens_per_minute: 100000}
observability:
  tracing: %s
`, upstream, hex.EncodeToString(sum[:]), tracing)
}

// chat sends a chat completion under the client's trace and returns the request id.
func chat(t *testing.T, p *proxyProcess) string {
	t.Helper()
	req, err := http.NewRequest("POST", p.url+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk-alice")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+clientTrace+"-"+clientParent+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	return resp.Header.Get("X-Tokenwarden-Request-Id")
}

// checkServerSpan checks that the receiver got the request's server span, under the
// client's parent, with the GenAI attributes, from service.
func checkServerSpan(t *testing.T, rc *otlpreceiver.Receiver, requestID, service string) {
	t.Helper()
	var srv *tracepb.Span
	waitFor(t, "the server span", func() bool {
		srv = rc.Trace(clientTrace)["chat gpt-4o"]
		return srv != nil
	})
	if got := hex.EncodeToString(srv.ParentSpanId); got != clientParent {
		t.Errorf("parent span %s, want the client's %s", got, clientParent)
	}
	if srv.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("span kind %v, want server", srv.Kind)
	}
	want := map[string]any{
		"gen_ai.operation.name":      "chat",
		"gen_ai.provider.name":       "openai",
		"gen_ai.request.model":       "gpt-4o",
		"gen_ai.request.max_tokens":  int64(50),
		"gen_ai.usage.input_tokens":  int64(100),
		"gen_ai.usage.output_tokens": int64(30),
		"tokenwarden.decision":       "admitted",
		"tokenwarden.request_id":     requestID,
	}
	got := otlpreceiver.Attrs(srv)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attribute %s = %v (%T), want %v", k, got[k], got[k], v)
		}
	}
	services := rc.Services()
	found := false
	for _, s := range services {
		found = found || s == service
	}
	if !found {
		t.Errorf("service.name %v, want %s", services, service)
	}
}

func TestTracesFromTheBinary(t *testing.T) {
	llm := fakellm.New()
	llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 30})
	upstream := httptest.NewServer(llm)
	t.Cleanup(upstream.Close)

	t.Run("configured by the config document, over OTLP/gRPC, sent when the proxy stops", func(t *testing.T) {
		rc, endpoint, err := otlpreceiver.Start(t, otlpreceiver.GRPC)
		if err != nil {
			t.Fatal(err)
		}
		p := startProxy(t, tracedDoc(upstream.URL,
			fmt.Sprintf(`{enabled: true, protocol: grpc, endpoint: %q, insecure: true, service_name: doc-proxy}`, endpoint)))
		id := chat(t, p)
		// The batch exporter's default delay is 5 s: the stop sends what is left.
		p.stop(t)
		checkServerSpan(t, rc, id, "doc-proxy")
	})

	t.Run("configured by the OTEL_* environment, over OTLP/HTTP", func(t *testing.T) {
		rc, endpoint, err := otlpreceiver.Start(t, otlpreceiver.HTTP)
		if err != nil {
			t.Fatal(err)
		}
		p := startProxy(t, tracedDoc(upstream.URL, `{enabled: true}`),
			"OTEL_EXPORTER_OTLP_ENDPOINT="+endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_SERVICE_NAME=env-proxy", "OTEL_BSP_SCHEDULE_DELAY=50")
		id := chat(t, p)
		// Exported while the proxy runs, within the environment's 50 ms batch delay.
		checkServerSpan(t, rc, id, "env-proxy")
	})
}
