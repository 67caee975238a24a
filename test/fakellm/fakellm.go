// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package fakellm is a fake OpenAI- and Anthropic-compatible backend for tests and the
// demo: the one part of the system that cannot run for real here. It answers chat
// completions, completions, Responses and Anthropic messages, as JSON or as a stream,
// with the usage, latency, status and stream behaviour a test sets, and records what
// it received.
package fakellm

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Behaviour is what the backend does with the next requests.
type Behaviour struct {
	// InputTokens and OutputTokens are the usage reported. OutputTokens is also the
	// number of stream deltas (one word each).
	InputTokens, OutputTokens int64
	// CachedTokens, when positive, reports that many of the input tokens as read from
	// the prompt cache, in each family's field (non-streamed chat and messages).
	CachedTokens int64
	// OmitUsage leaves usage out of every response and stream.
	OmitUsage bool
	// Latency delays the response headers.
	Latency time.Duration
	// ChunkDelay delays each stream chunk.
	ChunkDelay time.Duration
	// Status, when set, answers with this status and an error body in the route's shape
	// (ErrorBody, when set, instead).
	Status    int
	ErrorBody string
	// CutAfter, when positive, ends a stream abruptly after this many deltas (no usage,
	// no end marker), as a crashing backend would.
	CutAfter int
	// CutAtStart ends a stream abruptly after its opening events, before any delta.
	CutAtStart bool
	// Encoding compresses every answer with this Content-Encoding whatever the request
	// accepts: "gzip", "deflate" (zlib, as HTTP defines it), "deflate-raw" (raw
	// deflate labelled deflate, as some servers send), or any other name, which labels
	// the plain bytes with that encoding.
	Encoding string
	// PadBytes adds a "padding" string of this many bytes to a JSON answer, and to the
	// object of a stream's closing usage event (before its usage), making one huge
	// event line.
	PadBytes int
	// Header is added to every answer (provider rate limit headers, for instance).
	Header map[string]string
	// Statuses is a sequence: the backend's Nth request since Set is answered with
	// Statuses[N] (0: a normal answer), and requests after the sequence as Status says.
	// A request that carries its own behaviour (HeaderBehaviour) does not advance it.
	Statuses []int
	// StartDelay delays a stream's first event after its headers: a slow start.
	StartDelay time.Duration
}

// Request is one request the backend received.
type Request struct {
	Method string
	// Path is the decoded path; RawPath the path as it arrived on the wire.
	Path    string
	RawPath string
	Header  http.Header
	Body    []byte
}

// Headers a client may send through the proxy to steer one request of the fake
// backend, so that many kinds of traffic can share one backend (the soak does).
const (
	// HeaderBehaviour is a JSON Behaviour that replaces the backend's for this request.
	HeaderBehaviour = "X-Fakellm-Behaviour"
	// HeaderTenant names who the request is for: Served counts its tokens.
	HeaderTenant = "X-Fakellm-Tenant"
)

// Server is the fake backend. It is an http.Handler.
type Server struct {
	mu       sync.Mutex
	b        Behaviour
	requests []Request
	ignore   bool // record no requests
	served   map[string]int64
	// seq is the number of requests answered under the behaviour's Statuses.
	seq int
}

// New returns a backend that reports 10 input and 20 output tokens.
func New() *Server {
	return &Server{b: Behaviour{InputTokens: 10, OutputTokens: 20}, served: map[string]int64{}}
}

// StopRecording stops keeping the requests received, for a long run whose memory must
// stay flat.
func (s *Server) StopRecording() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ignore, s.requests = true, nil
}

// Served returns, per HeaderTenant, the tokens the backend has served: the input of
// every answer it began, plus the output it generated (up to a cut).
func (s *Server) Served() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.served))
	for k, v := range s.served {
		out[k] = v
	}
	return out
}

// generated is the output an answer under b carries.
func (b Behaviour) generated(stream bool) int64 {
	switch {
	case !stream:
		return b.OutputTokens
	case b.CutAtStart:
		return 0
	case b.CutAfter > 0 && int64(b.CutAfter) < b.OutputTokens:
		return int64(b.CutAfter)
	}
	return b.OutputTokens
}

// Set replaces the behaviour.
func (s *Server) Set(b Behaviour) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b, s.seq = b, 0
}

// Behaviour returns the current behaviour.
func (s *Server) Behaviour() Behaviour {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b
}

// Requests returns what the backend has received.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Reset forgets the recorded requests.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
}

type body struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	b := s.b
	if len(b.Statuses) > 0 && r.Header.Get(HeaderBehaviour) == "" {
		if s.seq < len(b.Statuses) {
			b.Status = b.Statuses[s.seq]
		}
		s.seq++
	}
	if !s.ignore {
		s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, RawPath: r.URL.EscapedPath(), Header: r.Header.Clone(), Body: raw})
	}
	s.mu.Unlock()
	if h := r.Header.Get(HeaderBehaviour); h != "" {
		if err := json.Unmarshal([]byte(h), &b); err != nil {
			http.Error(w, "bad "+HeaderBehaviour+": "+err.Error(), http.StatusBadRequest)
			return
		}
	}

	var req body
	_ = json.Unmarshal(raw, &req)
	if req.Model == "" {
		req.Model = "fake-model"
	}
	if tenant := r.Header.Get(HeaderTenant); tenant != "" && b.Status == 0 {
		s.mu.Lock()
		s.served[tenant] += b.InputTokens + b.generated(req.Stream)
		s.mu.Unlock()
	}
	if b.Latency > 0 {
		select {
		case <-time.After(b.Latency):
		case <-r.Context().Done():
			return
		}
	}
	for k, v := range b.Header {
		w.Header().Set(k, v)
	}
	if b.Encoding != "" {
		ew := newEncoder(w, b.Encoding)
		defer ew.close()
		w = ew
	}
	anthropic := strings.HasSuffix(r.URL.Path, "/v1/messages")
	if b.Status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(b.Status)
		switch {
		case b.ErrorBody != "":
			_, _ = io.WriteString(w, b.ErrorBody)
		case anthropic:
			fmt.Fprintf(w, `{"type":"error","error":{"type":"api_error","message":"fake error %d"}}`, b.Status)
		default:
			fmt.Fprintf(w, `{"error":{"message":"fake error %d","type":"server_error","code":null}}`, b.Status)
		}
		return
	}
	switch {
	case r.URL.Path == "/v1/models":
		writeJSON(w, map[string]any{"object": "list", "data": []map[string]any{{"id": req.Model, "object": "model", "owned_by": "fakellm"}}})
	case strings.HasSuffix(r.URL.Path, "/v1/chat/completions"), strings.HasSuffix(r.URL.Path, "/v1/completions"):
		chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
		if req.Stream {
			s.streamChat(w, r, b, req.Model, chat)
		} else {
			writeJSON(w, pad(b, chatResponse(b, req.Model, chat)))
		}
	case strings.HasSuffix(r.URL.Path, "/v1/responses"), strings.HasSuffix(r.URL.Path, "/v1/responses/compact"):
		if req.Stream {
			s.streamResponses(w, r, b, req.Model)
		} else {
			writeJSON(w, pad(b, responsesResponse(b, req.Model)))
		}
	case anthropic:
		if req.Stream {
			s.streamMessages(w, r, b, req.Model)
		} else {
			writeJSON(w, pad(b, messagesResponse(b, req.Model)))
		}
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"no route %s","type":"invalid_request_error"}}`, r.URL.Path)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// pad adds PadBytes of padding to an answer object; encoding/json writes its keys in
// order, so "padding" comes before "usage".
func pad(b Behaviour, v map[string]any) map[string]any {
	if b.PadBytes > 0 {
		v["padding"] = strings.Repeat("x", b.PadBytes)
	}
	return v
}

func text(b Behaviour) string {
	return strings.TrimSpace(strings.Repeat("word ", int(b.OutputTokens)))
}

func chatResponse(b Behaviour, model string, chat bool) map[string]any {
	resp := map[string]any{"id": "chatcmpl-fake", "created": time.Now().Unix(), "model": model}
	if chat {
		resp["object"] = "chat.completion"
		resp["choices"] = []map[string]any{{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": text(b)}}}
	} else {
		resp["object"] = "text_completion"
		resp["choices"] = []map[string]any{{"index": 0, "finish_reason": "stop", "text": text(b)}}
	}
	if !b.OmitUsage {
		u := map[string]any{"prompt_tokens": b.InputTokens, "completion_tokens": b.OutputTokens, "total_tokens": b.InputTokens + b.OutputTokens}
		if b.CachedTokens > 0 {
			u["prompt_tokens_details"] = map[string]any{"cached_tokens": b.CachedTokens}
		}
		resp["usage"] = u
	}
	return resp
}

func responsesResponse(b Behaviour, model string) map[string]any {
	resp := map[string]any{
		"id": "resp_fake", "object": "response", "created_at": time.Now().Unix(), "status": "completed", "model": model,
		"output": []map[string]any{{"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
			"content": []map[string]any{{"type": "output_text", "text": text(b), "annotations": []any{}}}}},
	}
	if !b.OmitUsage {
		resp["usage"] = map[string]any{"input_tokens": b.InputTokens, "output_tokens": b.OutputTokens, "total_tokens": b.InputTokens + b.OutputTokens,
			"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}
	}
	return resp
}

func messagesResponse(b Behaviour, model string) map[string]any {
	resp := map[string]any{
		"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "stop_reason": "end_turn", "stop_sequence": nil,
		"content": []map[string]any{{"type": "text", "text": text(b)}},
	}
	if !b.OmitUsage {
		u := map[string]any{"input_tokens": b.InputTokens, "output_tokens": b.OutputTokens}
		if b.CachedTokens > 0 {
			// Anthropic's input_tokens leaves out the tokens read from the cache.
			u["input_tokens"], u["cache_read_input_tokens"] = b.InputTokens-b.CachedTokens, b.CachedTokens
		}
		resp["usage"] = u
	}
	return resp
}

// sse writes server-sent events, flushing each, and honours ChunkDelay and the client
// going away.
type sse struct {
	w       http.ResponseWriter
	r       *http.Request
	b       Behaviour
	started bool
}

func newSSE(w http.ResponseWriter, r *http.Request, b Behaviour) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, r: r, b: b}
}

func (e *sse) send(event string, v any) bool {
	if !e.started && e.b.StartDelay > 0 {
		// The headers go out at once; the first event waits.
		e.w.(http.Flusher).Flush()
		select {
		case <-time.After(e.b.StartDelay):
		case <-e.r.Context().Done():
			return false
		}
	}
	e.started = true
	if e.b.ChunkDelay > 0 {
		select {
		case <-time.After(e.b.ChunkDelay):
		case <-e.r.Context().Done():
			return false
		}
	}
	data, _ := json.Marshal(v)
	if event != "" {
		fmt.Fprintf(e.w, "event: %s\n", event)
	}
	fmt.Fprintf(e.w, "data: %s\n\n", data)
	e.w.(http.Flusher).Flush()
	return e.r.Context().Err() == nil
}

// cut ends the response abruptly: the connection is dropped mid-stream.
func (e *sse) cut() {
	if hj, ok := e.w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			_ = c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func (s *Server) streamChat(w http.ResponseWriter, r *http.Request, b Behaviour, model string, chat bool) {
	e := newSSE(w, r, b)
	if b.CutAtStart {
		e.cut()
		return
	}
	for i := 0; i < int(b.OutputTokens); i++ {
		if b.CutAfter > 0 && i == b.CutAfter {
			e.cut()
			return
		}
		chunk := map[string]any{"id": "chatcmpl-fake", "model": model, "created": time.Now().Unix()}
		if chat {
			chunk["object"] = "chat.completion.chunk"
			delta := map[string]any{"content": "word "}
			if i == 0 {
				// The first delta names the role, as OpenAI's do: the SDKs' stream
				// helpers need it.
				delta["role"] = "assistant"
			}
			chunk["choices"] = []map[string]any{{"index": 0, "delta": delta, "finish_reason": nil}}
		} else {
			chunk["object"] = "text_completion"
			chunk["choices"] = []map[string]any{{"index": 0, "text": "word ", "finish_reason": nil}}
		}
		if !e.send("", chunk) {
			return
		}
	}
	last := map[string]any{}
	if b.OutputTokens <= 0 {
		last["role"] = "assistant" // no delta named it
	}
	final := map[string]any{"id": "chatcmpl-fake", "model": model, "object": "chat.completion.chunk", "created": time.Now().Unix(),
		"choices": []map[string]any{{"index": 0, "delta": last, "finish_reason": "stop"}}}
	e.send("", final)
	if !b.OmitUsage {
		e.send("", pad(b, map[string]any{"id": "chatcmpl-fake", "model": model, "object": "chat.completion.chunk", "created": time.Now().Unix(),
			"choices": []any{}, "usage": map[string]any{"prompt_tokens": b.InputTokens, "completion_tokens": b.OutputTokens, "total_tokens": b.InputTokens + b.OutputTokens}}))
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	w.(http.Flusher).Flush()
}

// encoder compresses an answer as it is written, flushing the compressor with the
// stream's every flush, so a compressed stream still arrives event by event.
type encoder struct {
	http.ResponseWriter
	name string
	z    interface {
		io.Writer
		Flush() error
		Close() error
	}
	started bool
}

func newEncoder(w http.ResponseWriter, name string) *encoder {
	e := &encoder{ResponseWriter: w, name: name}
	switch name {
	case "gzip":
		e.z = gzip.NewWriter(w)
	case "deflate":
		e.z = zlib.NewWriter(w)
	case "deflate-raw":
		e.z, _ = flate.NewWriter(w, flate.DefaultCompression)
		e.name = "deflate"
	}
	return e
}

func (e *encoder) WriteHeader(code int) {
	if !e.started {
		e.started = true
		e.Header().Set("Content-Encoding", e.name)
		e.Header().Del("Content-Length")
	}
	e.ResponseWriter.WriteHeader(code)
}

func (e *encoder) Write(p []byte) (int, error) {
	if !e.started {
		e.WriteHeader(http.StatusOK)
	}
	if e.z == nil {
		return e.ResponseWriter.Write(p)
	}
	return e.z.Write(p)
}

func (e *encoder) Flush() {
	if e.z != nil {
		_ = e.z.Flush()
	}
	e.ResponseWriter.(http.Flusher).Flush()
}

// Hijack lets a stream be cut through the encoder.
func (e *encoder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(e.ResponseWriter).Hijack()
}

func (e *encoder) close() {
	if e.z != nil {
		_ = e.z.Close()
	}
}

// streamResponses streams a Responses answer with the events the SDKs' stream helpers
// accumulate: the response created, the message item and its text part added, the
// text deltas, each part and item done, and response.completed with the whole output.
func (s *Server) streamResponses(w http.ResponseWriter, r *http.Request, b Behaviour, model string) {
	e := newSSE(w, r, b)
	seq := 0
	send := func(typ string, fields map[string]any) bool {
		seq++
		fields["type"], fields["sequence_number"] = typ, seq
		return e.send(typ, fields)
	}
	base := responsesResponse(Behaviour{OmitUsage: true}, model)
	base["status"] = "in_progress"
	base["output"] = []any{}
	send("response.created", map[string]any{"response": base})
	send("response.in_progress", map[string]any{"response": base})
	if b.CutAtStart {
		e.cut()
		return
	}
	item := func(status string, content ...map[string]any) map[string]any {
		if content == nil {
			content = []map[string]any{}
		}
		return map[string]any{"type": "message", "id": "msg_fake", "status": status, "role": "assistant", "content": content}
	}
	part := func(text string) map[string]any {
		return map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
	}
	at := map[string]any{"item_id": "msg_fake", "output_index": 0, "content_index": 0}
	with := func(kv ...any) map[string]any {
		m := map[string]any{}
		for k, v := range at {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	send("response.output_item.added", map[string]any{"output_index": 0, "item": item("in_progress")})
	send("response.content_part.added", with("part", part("")))
	var full strings.Builder
	for i := 0; i < int(b.OutputTokens); i++ {
		if b.CutAfter > 0 && i == b.CutAfter {
			e.cut()
			return
		}
		full.WriteString("word ")
		if !send("response.output_text.delta", with("delta", "word ", "logprobs", []any{})) {
			return
		}
	}
	text := full.String()
	send("response.output_text.done", with("text", text, "logprobs", []any{}))
	send("response.content_part.done", with("part", part(text)))
	send("response.output_item.done", map[string]any{"output_index": 0, "item": item("completed", part(text))})
	done := pad(b, responsesResponse(b, model))
	done["output"] = []map[string]any{item("completed", part(text))}
	send("response.completed", map[string]any{"response": done})
}

func (s *Server) streamMessages(w http.ResponseWriter, r *http.Request, b Behaviour, model string) {
	e := newSSE(w, r, b)
	usage := map[string]any{"input_tokens": b.InputTokens, "output_tokens": 1}
	msg := map[string]any{"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil}
	if !b.OmitUsage {
		msg["usage"] = usage
	}
	e.send("message_start", map[string]any{"type": "message_start", "message": msg})
	e.send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	if b.CutAtStart {
		e.cut()
		return
	}
	for i := 0; i < int(b.OutputTokens); i++ {
		if b.CutAfter > 0 && i == b.CutAfter {
			e.cut()
			return
		}
		if !e.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": "word "}}) {
			return
		}
	}
	e.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	delta := pad(b, map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}})
	if !b.OmitUsage {
		delta["usage"] = map[string]any{"output_tokens": b.OutputTokens}
	}
	e.send("message_delta", delta)
	e.send("message_stop", map[string]any{"type": "message_stop"})
}
