// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/settlement"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// newReverseProxy is up's reverse proxy (proxy/upstream) with the request path's
// hooks: the path classified and the trace context go upstream, only encodings the
// usage reader can decode are offered, and the answer or the error comes back here.
func (s *Server) newReverseProxy(up *upstream.Upstream, tr http.RoundTripper) *httputil.ReverseProxy {
	return upstream.NewReverseProxy(up, tr, upstream.Hooks{
		Prepare:        s.prepare,
		ModifyResponse: s.onResponse,
		ErrorHandler:   s.onError,
		// A client that goes away mid-copy is routine: log it at debug level.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	})
}

// prepare sets on the outgoing request the path classified and the upstream span's
// trace context, and offers only the encodings the usage reader can decode. It
// reports the request's API family.
func (s *Server) prepare(pr *httputil.ProxyRequest) refusal.Family {
	offerEncodings(pr.Out.Header)
	ex, _ := pr.In.Context().Value(holdKey{}).(*exchange)
	if ex == nil {
		return refusal.OpenAI
	}
	p := ex.route.path
	if ex.route.stripPrefix != "" {
		p = strings.TrimPrefix(p, ex.route.stripPrefix)
	}
	setEscapedPath(pr.Out.URL, p)
	if ex.upSpan != nil {
		s.tracing.inject(pr.Out.Context(), pr.Out.Header)
	}
	return ex.route.family
}

// handOff records that the request is handed to up at the time at: the upstream the
// access log names, and the start of the upstream latency (an earlier attempt's answer
// is forgotten).
func (ex *exchange) handOff(up *upstream.Upstream, at time.Time) {
	ex.rec.Upstream, ex.rec.UpstreamStart, ex.rec.UpstreamHeaders = up.Name, at, time.Time{}
	ex.attempts++
}

// onResponse runs when the upstream's headers arrive: it replaces the upstream's rate
// limit headers with this proxy's, releases the hold of a failed answer, and wraps a
// successful body so that it settles on what the body reports.
func (s *Server) onResponse(resp *http.Response) error {
	ex, _ := resp.Request.Context().Value(holdKey{}).(*exchange)
	if ex == nil {
		return nil
	}
	ex.status = resp.StatusCode
	ex.upstreamAnswered(resp.Header, s.clock.Now())
	// A learned capacity learns from the answer (proxy/schedule/learn.go).
	ex.slot.Answered(resp.StatusCode)
	s.metrics.UpstreamDuration.WithLabelValues(ex.upstream.Name).Observe(ex.rec.UpstreamHeaders.Sub(ex.rec.UpstreamStart).Seconds())
	if err := s.attemptAnswered(ex, resp); err != nil {
		return err
	}
	success := resp.StatusCode >= 200 && resp.StatusCode <= 299
	refusal.StripUpstreamLimits(resp.Header, success)
	// The proxy's own headers go straight to the client's answer: the reverse proxy
	// copies the upstream's with an allocation for each.
	refusal.SetLimitHeaders(ex.cw.Header(), &ex.dec, s.clock.Now(), ex.route.family)
	if !success {
		ex.cacheAnswered(resp, false)
		s.release(ex)
		return nil
	}
	if !ex.route.charged {
		return nil
	}
	st := &settler{ReadCloser: resp.Body, s: s, ex: ex, status: resp.StatusCode, header: resp.Header}
	resp.Body = st
	codings, ok := contentCodings(resp.Header)
	if !ok {
		st.undecodable = true
		ex.cacheUndecodable()
		return nil
	}
	stream := isEventStream(resp.Header.Get("Content-Type"), ex.est.Stream)
	if stream {
		st.stream = streamReaders.Get().(*usage.Stream)
		st.reader = st.stream
	} else {
		st.body = bodyReaders.Get().(*usage.Body)
		st.reader = st.body
	}
	// The cache takes the body decoded: a waiter and a hit get it without a coding.
	st.sink = st.reader
	if tee := ex.cacheAnswered(resp, stream); tee != nil {
		st.tee = teeWriter{st.reader, tee}
		st.sink = &st.tee
	}
	if len(codings) > 0 {
		st.dec = newDecoder(codings, st.sink)
	}
	return nil
}

// isEventStream reports whether a response is a server-sent-events stream: by its
// Content-Type, or, when it names none, by the request asking for a stream.
func isEventStream(contentType string, asked bool) bool {
	const sse = "text/event-stream"
	if contentType == "" {
		return asked
	}
	return len(contentType) >= len(sse) && strings.EqualFold(contentType[:len(sse)], sse)
}

// onError answers a request the upstream did not: the hold is released and the client
// gets a JSON error in its route's shape (nothing, when the client itself went away).
func (s *Server) onError(w http.ResponseWriter, r *http.Request, err error) {
	ex, _ := r.Context().Value(holdKey{}).(*exchange)
	if ex == nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	if s.attemptFailed(ex, r, err) {
		return // the model's next upstream takes the request
	}
	ex.cacheFailed()
	s.release(ex)
	if r.Context().Err() != nil {
		ex.status = 499 // the client closed the request
		return
	}
	s.metrics.UpstreamErrors.WithLabelValues(ex.upstream.Name).Inc()
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		ex.fail(http.StatusGatewayTimeout, "upstream_timeout", "the upstream "+ex.upstream.Name+" did not answer in time", nil)
		return
	}
	s.log.Warn("Upstream request failed", "upstream", ex.upstream.Name, "error", err)
	ex.fail(http.StatusBadGateway, "upstream_unavailable", "the upstream "+ex.upstream.Name+" could not be reached", nil)
}

// The usage readers are lent to each response and given back when it settles: a
// reader holds about a kilobyte, on every charged answer.
var (
	bodyReaders   = sync.Pool{New: func() any { return new(usage.Body) }}
	streamReaders = sync.Pool{New: func() any { return new(usage.Stream) }}
)

// giveBack returns the reader to its pool; the settler reads nothing more.
func (st *settler) giveBack() {
	st.reader, st.sink = nil, nil
	if st.body != nil {
		st.body.Reset()
		bodyReaders.Put(st.body)
		st.body = nil
	}
	if st.stream != nil {
		st.stream.Reset()
		streamReaders.Put(st.stream)
		st.stream = nil
	}
}

// usageReader reads a response body's usage as it passes through.
type usageReader interface {
	io.Writer
	Settlement(inputEstimate int64, end usage.End) (usage.Usage, usage.Verdict)
}

// settler passes a successful response through unchanged and, when the body is
// closed, ends its hold as docs/proxy.md "Settlement" says: on the usage the body
// reported, on the input estimate plus the output counted in the body, at the whole
// reservation when the body cannot be read, and released only when the upstream
// produced no output.
type settler struct {
	io.ReadCloser
	s      *Server
	ex     *exchange
	reader usageReader
	// sink is where the decoded body goes: the reader, and the response cache's
	// recorder and waiters when it takes the answer.
	sink io.Writer
	tee  teeWriter
	// status and header are the upstream's, for the cache.
	status int
	header http.Header
	// body or stream is the reader, lent by a pool.
	body   *usage.Body
	stream *usage.Stream
	// dec decodes a compressed body for the reader; the client gets the bytes as sent.
	dec *decoder
	// undecodable: the body's encoding is one the proxy cannot decode.
	undecodable bool
	// n counts the body's bytes; eof is true once the upstream ended the body.
	n    int64
	eof  bool
	once sync.Once
}

// teeWriter writes to the usage reader, then to the cache: io.MultiWriter without
// an allocation of its own.
type teeWriter struct{ reader, cache io.Writer }

func (t *teeWriter) Write(p []byte) (int, error) {
	if n, err := t.reader.Write(p); err != nil {
		return n, err
	}
	return t.cache.Write(p)
}

func (st *settler) Read(p []byte) (int, error) {
	n, err := st.ReadCloser.Read(p)
	if n > 0 {
		st.n += int64(n)
		switch {
		case st.dec != nil:
			st.dec.write(p[:n])
		case st.sink != nil:
			_, _ = st.sink.Write(p[:n])
		}
	}
	if err == io.EOF {
		st.eof = true
	}
	return n, err
}

func (st *settler) Close() error {
	st.drainForWaiters()
	err := st.ReadCloser.Close()
	st.once.Do(st.finish)
	return err
}

func (st *settler) finish() {
	ex := st.ex
	end := usage.Complete
	if !st.eof {
		end = usage.Cut
	}
	if st.dec != nil {
		if st.dec.close(st.eof) != nil && st.eof {
			end = usage.Unreadable
		}
		st.dec = nil
	}
	var u usage.Usage
	verdict := usage.Reserve
	switch {
	case st.undecodable:
		if st.n == 0 {
			verdict = usage.Release
		}
	default:
		u, verdict = st.reader.Settlement(ex.est.Input, end)
	}
	st.giveBack()
	ex.rec.End = end
	st.s.cacheEnded(ex, st.status, st.header, end, verdict, u)
	switch verdict {
	case usage.Settle:
		st.s.settle(ex, u, settlement.Usage)
	case usage.Reserve:
		// The reservation stands: the request is charged what it reserved.
		st.s.settle(ex, usage.Usage{Input: ex.est.Input, Output: ex.est.Output}, settlement.Reserved)
	default:
		st.s.release(ex)
	}
}
