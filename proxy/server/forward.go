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

	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// maxJSONUsageBody bounds how much of a non-streamed response is kept to read its
// usage; a larger body passes through and releases its hold.
const maxJSONUsageBody = 8 << 20

func (s *Server) newReverseProxy(up *upstream, tr http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			ex, _ := pr.In.Context().Value(holdKey{}).(*exchange)
			if ex != nil && ex.route.stripPrefix != "" {
				pr.Out.URL.Path = strings.TrimPrefix(pr.Out.URL.Path, ex.route.stripPrefix)
				pr.Out.URL.RawPath = ""
			}
			pr.SetURL(up.target)
			pr.SetXForwarded()
			// The client's credential is tokenwarden's; it never reaches the backend.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("X-Api-Key")
			if up.credential != "" {
				if ex != nil && ex.route.family == Anthropic {
					pr.Out.Header.Set("X-Api-Key", up.credential)
				} else {
					pr.Out.Header.Set("Authorization", "Bearer "+up.credential)
				}
			}
		},
		Transport:      tr,
		BufferPool:     copyBuffers,
		ModifyResponse: onResponse,
		ErrorHandler:   onError,
		// A client that goes away mid-copy is routine: log it at debug level.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

// onResponse runs when the upstream's headers arrive: it reports this proxy's rate
// limit headers, releases the hold of a failed answer, and wraps a successful body so
// that it settles on the usage the body reports.
func onResponse(resp *http.Response) error {
	ex, _ := resp.Request.Context().Value(holdKey{}).(*exchange)
	if ex == nil {
		return nil
	}
	s := ex.s
	ex.status = resp.StatusCode
	s.metrics.UpstreamDuration.WithLabelValues(ex.upstream.name).Observe(s.clock.Now().Sub(ex.start).Seconds())
	setLimitHeaders(resp.Header, &ex.dec, s.clock.Now())
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ex.release()
		return nil
	}
	if !ex.route.charged {
		return nil
	}
	st := &settler{ReadCloser: resp.Body, ex: ex}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		st.stream = &usage.Stream{}
	}
	resp.Body = st
	return nil
}

// onError answers a request the upstream did not: the hold is released and the client
// gets a JSON error in its route's shape (nothing, when the client itself went away).
func onError(w http.ResponseWriter, r *http.Request, err error) {
	ex, _ := r.Context().Value(holdKey{}).(*exchange)
	if ex == nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	ex.release()
	if r.Context().Err() != nil {
		ex.status = 499 // the client closed the request
		return
	}
	ex.s.metrics.UpstreamErrors.WithLabelValues(ex.upstream.name).Inc()
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		ex.fail(w, http.StatusGatewayTimeout, "upstream_timeout", "the upstream "+ex.upstream.name+" did not answer in time", nil)
		return
	}
	ex.s.log.Warn("Upstream request failed", "upstream", ex.upstream.name, "error", err)
	ex.fail(w, http.StatusBadGateway, "upstream_unavailable", "the upstream "+ex.upstream.name+" could not be reached", nil)
}

// settler passes a successful response through and settles its hold when the body is
// closed: on the reported usage if the body reached its end, or by release otherwise
// (a cut stream, a client that went away, a body with no usage).
type settler struct {
	io.ReadCloser
	ex     *exchange
	stream *usage.Stream
	buf    []byte
	over   bool
	eof    bool
	once   sync.Once
}

func (st *settler) Read(p []byte) (int, error) {
	n, err := st.ReadCloser.Read(p)
	if n > 0 {
		if st.stream != nil {
			_, _ = st.stream.Write(p[:n])
		} else if !st.over {
			if len(st.buf)+n > maxJSONUsageBody {
				st.over, st.buf = true, nil
			} else {
				st.buf = append(st.buf, p[:n]...)
			}
		}
	}
	if err == io.EOF {
		st.eof = true
	}
	return n, err
}

func (st *settler) Close() error {
	err := st.ReadCloser.Close()
	st.once.Do(st.finish)
	return err
}

func (st *settler) finish() {
	ex := st.ex
	var u usage.Usage
	switch {
	case !st.eof:
		// The body did not reach its end: the client went away or the upstream cut it.
	case st.stream != nil:
		if st.stream.Ended() {
			u = st.stream.Final(ex.est.Input)
		}
	case !st.over:
		u = usage.FromJSON(st.buf)
	}
	if !u.Found {
		ex.release()
		return
	}
	ex.settle(u)
}

func (ex *exchange) settle(u usage.Usage) {
	s := ex.s
	if ex.hold.Settle(u.Total()) {
		s.metrics.Settlements.WithLabelValues("settled").Inc()
	}
	// The model label stays bounded: a model the config names, or "other".
	model := "other"
	if ex.rt.knownModels[ex.est.Model] {
		model = ex.est.Model
	}
	s.metrics.Usage.WithLabelValues(model, "input").Add(float64(u.Input))
	s.metrics.Usage.WithLabelValues(model, "output").Add(float64(u.Output))
	if ex.key != "" {
		s.metrics.KeyUsage.WithLabelValues(ex.key, "input").Add(float64(u.Input))
		s.metrics.KeyUsage.WithLabelValues(ex.key, "output").Add(float64(u.Output))
	}
}

func (ex *exchange) release() {
	if ex.hold.Release() {
		ex.s.metrics.Settlements.WithLabelValues("released").Inc()
	}
}

// bufferPool lends the reverse proxy its copy buffers.
type bufferPool struct{ p sync.Pool }

var copyBuffers = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}

func (b *bufferPool) Get() []byte  { return *(b.p.Get().(*[]byte)) }
func (b *bufferPool) Put(p []byte) { b.p.Put(&p) }
