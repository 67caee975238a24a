// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// RequestIDHeader returns a request's id to the client. The id is the client's own
// when it sends a sane one in this header or in X-Request-Id, and a new random one
// otherwise; it goes upstream as X-Request-Id. The upstream's own X-Request-Id
// reaches the client unchanged (the provider's id, for its support), and the access
// log keeps it as upstream_request_id.
const RequestIDHeader = "X-Tokenwarden-Request-Id"

// forwardedIDHeader carries the request's id upstream.
const forwardedIDHeader = "X-Request-Id"

// requestID is the request's id: the client's, when it is 1 to 128 printable
// characters without spaces or quotes, or else a new random one. same reports that
// the request already carries it as X-Request-Id.
func requestID(r *http.Request) (string, bool) {
	if v := r.Header.Get(RequestIDHeader); saneID(v) {
		return v, r.Header.Get(forwardedIDHeader) == v
	}
	if v := r.Header.Get(forwardedIDHeader); saneID(v) {
		return v, true
	}
	var b [32]byte
	var raw [16]byte
	for i, n := range [2]uint64{rand.Uint64(), rand.Uint64()} {
		for j := range 8 {
			raw[i*8+j] = byte(n >> (8 * j))
		}
	}
	hex.Encode(b[:], raw[:])
	return string(b[:]), false
}

func saneID(v string) bool {
	if len(v) == 0 || len(v) > 128 {
		return false
	}
	for i := range len(v) {
		if c := v[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// counter counts the bytes the client is sent. It keeps the writer's flushing (for
// streams) and lets http.ResponseController reach the writer below it.
type counter struct {
	http.ResponseWriter
	n int64
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// Flush implements http.Flusher.
func (c *counter) Flush() { _ = http.NewResponseController(c.ResponseWriter).Flush() }

// Unwrap returns the writer below, for http.ResponseController.
func (c *counter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// begin starts a request's record and trace: its id (returned to the client and
// forwarded), and the server span when tracing is on. It returns the request to
// serve, with the span in its context.
func (s *Server) begin(ex *exchange, r *http.Request) *http.Request {
	rec := &ex.rec
	rec.Method = r.Method
	rec.Route = ex.route.name
	id, same := requestID(r)
	rec.RequestID = id
	v := []string{id}
	ex.w.Header()[RequestIDHeader] = v
	if !same {
		r.Header[forwardedIDHeader] = v
	}
	if s.tracing != nil {
		r = s.tracing.start(ex, r)
	}
	return r
}

// admitted records admission's outcome.
func (ex *exchange) admitted(id *budget.Identity, dec *budget.Decision) {
	rec := &ex.rec
	rec.Client = id.Client
	switch {
	case id.Exempt || (id.Key != nil && id.Key.Bypass):
		rec.Decision = accesslog.Exempt
	case dec.Refusal != nil:
		rec.Decision = accesslog.Refused
		rec.Refusal = dec.Refusal
	case dec.FailedOpen:
		rec.Decision = accesslog.FailedOpen
	default:
		rec.Decision = accesslog.Admitted
	}
	if dec.Hold != nil {
		rec.Reserved = ex.est.Total()
	}
}

// observe ends a request's record: the access log line, the refusal audit and the
// server span. It runs once the request is answered.
func (s *Server) observe(ex *exchange) {
	rt, rec := ex.rt, &ex.rec
	rec.Status = ex.status
	rec.BytesOut = ex.cw.n
	rec.Model = ex.est.Model
	if ex.span != nil {
		s.tracing.end(ex)
	}
	if rec.Decision == accesslog.Refused && rt != nil {
		tenant := ""
		if ex.key != nil {
			tenant = ex.key.Tenant
		}
		s.audit.Add(rec, rec.APIKey, tenant, ex.est.Total(), rt.cfg.Observability.RefusalAudit.Kept())
	}
	switch {
	case rt == nil || rt.cfg.Observability.AccessLog.Disabled:
		rec.Unlogged = true
	case rec.Status < 400:
		if p := rt.cfg.Observability.AccessLog.Sample(); p < 1 && rand.Float64() >= p {
			rec.Unlogged = true
		}
	}
	if ex.settling {
		if !rec.Unlogged {
			// The line is pending until the settlement is told: a flush waits for it.
			s.access.Expect()
		}
		if ex.arrived.Add(1) < 2 {
			// The store is still settling: Settled writes the line.
			return
		}
	}
	ex.writeLine()
}

// Settled implements budget.SettleReceiver: the store has settled the request's hold.
// The line is written by the last of Settled and observe, so it carries the debt
// without the request waiting for a store that settles off its goroutine.
func (ex *exchange) Settled(st budget.Settlement) {
	ex.rec.Debt, ex.rec.DebtDollars = st.Debt, st.DebtDollars
	if ex.arrived.Add(1) == 2 {
		ex.writeLine()
	}
}

// writeLine puts the request's line in the access log's buffer, unless it is unlogged.
func (ex *exchange) writeLine() {
	if ex.rec.Unlogged {
		return
	}
	ex.log.Send(&ex.rec)
	if ex.settling {
		ex.log.Arrived()
	}
}

// observeApply takes a new config's access log fields and refusal audit bounds.
func (s *Server) observeApply(rt *runtime) {
	s.access.SetFields(rt.cfg.Observability.AccessLog.Fields)
	s.audit.Prune(rt.cfg.Observability.RefusalAudit.Kept() == 0, func(key string) bool { return rt.policy.Key(key) != nil })
}

// FlushAccessLog waits until every access log line buffered is written, or ctx ends;
// a stopping proxy calls it once no request is in flight.
func (s *Server) FlushAccessLog(ctx context.Context) { s.access.Flush(ctx) }

// upstreamAnswered records the upstream's answer: when its headers came, and its own
// request id.
func (ex *exchange) upstreamAnswered(h http.Header, now time.Time) {
	ex.rec.UpstreamHeaders = now
	if v := h.Get(forwardedIDHeader); v != "" {
		ex.rec.UpstreamID = v
	}
}
