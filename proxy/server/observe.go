// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// RequestIDHeader returns a request's id to the client. The id is the client's own
// when it sends a sane one in this header or in X-Request-Id, and a new random one
// otherwise; it goes upstream as X-Request-Id. The upstream's own X-Request-Id
// reaches the client unchanged (the provider's id, for its support), and the access
// log keeps it as upstream_request_id.
const RequestIDHeader = "X-Tokenwarden-Request-Id"

// forwardedIDHeader carries the request's id upstream.
const forwardedIDHeader = "X-Request-Id"

// decision is what admission did with a request, as the access log and traces name it.
type decision uint8

const (
	// rejected: answered before admission (authentication, a bad body, no upstream,
	// an unreachable store).
	rejected decision = iota
	admitted
	refused
	exempt
	failedOpen
)

var decisionNames = [...]string{"rejected", "admitted", "refused", "exempt", "failed_open"}

func (d decision) String() string { return decisionNames[d] }

// settlement is how a request's hold ended.
type settlement uint8

const (
	notSettled settlement = iota
	// settledUsage: on the usage the backend reported, or counted in a cut stream.
	settledUsage
	// settledReserved: the whole reservation was charged (the body was unreadable).
	settledReserved
	// released: the whole reservation was given back.
	released
)

var settlementNames = [...]string{"", "settled", "reserved", "released"}

// accessRecord is what one request leaves for the access log. It lives in its
// exchange and is copied by value into the log's buffer: the log costs the request no
// allocation of its own.
type accessRecord struct {
	start      time.Time
	requestID  string
	method     string
	client     string
	decision   decision
	errCode    string
	errMsg     string
	refusal    *budget.Refusal
	queue      bool
	settlement settlement
	end        usage.End
	used       usage.Usage
	// debt and debtDollars are what the settlement put into debt (budget.Settlement),
	// told by the store once it has settled.
	debt, debtDollars float64
	// unlogged: sampling or the config leaves the request out of the access log.
	unlogged bool
	// upstreamStart and upstreamHeaders time the upstream call: forwarded, answered.
	upstreamStart    time.Time
	upstreamHeaders  time.Time
	upstreamID       string
	finished         time.Time
	bytesIn          int64
	bytesOut         int64
	status           int
	route            string
	model            string
	apiKey           string
	user, team       string
	upstream         string
	reserved         int64
	traceID          trace.TraceID
	retryAfterSecond int64
}

// accessLog writes access log lines off the request path: a request puts its record
// in a bounded buffer and never waits; a record that finds the buffer full is
// dropped and counted.
type accessLog struct {
	ch      chan accessRecord
	handler slog.Handler
	m       *metrics.Observability
	pending atomic.Int64
	// fields is the bit set of AccessLogFields written, by their index; all when 0.
	fields atomic.Uint64
}

func newAccessLog(out io.Writer, buffer int, m *metrics.Observability) *accessLog {
	if out == nil {
		out = os.Stdout
	}
	if buffer <= 0 {
		buffer = config.DefaultAccessLogBufferLines
	}
	l := &accessLog{ch: make(chan accessRecord, buffer), handler: slog.NewJSONHandler(out, nil), m: m}
	go l.run()
	return l
}

// send puts a record in the buffer, or drops it when the buffer is full.
func (l *accessLog) send(rec *accessRecord) {
	l.pending.Add(1)
	select {
	case l.ch <- *rec:
	default:
		l.pending.Add(-1)
		l.m.Dropped.Inc()
	}
}

func (l *accessLog) run() {
	var sc scratch
	for rec := range l.ch {
		if err := l.handler.Handle(context.Background(), l.line(&rec, &sc)); err != nil {
			l.m.Failed.Inc()
		} else {
			l.m.Written.Inc()
		}
		l.pending.Add(-1)
	}
}

// stop ends the writer once the lines buffered are written.
func (l *accessLog) stop() { close(l.ch) }

// flush waits until every buffered line is written, or ctx ends.
func (l *accessLog) flush(ctx context.Context) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for l.pending.Load() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// setFields selects the fields written; empty selects them all.
func (l *accessLog) setFields(names []string) {
	var set uint64
	for _, n := range names {
		if i := slices.Index(config.AccessLogFields, n); i >= 0 {
			set |= 1 << i
		}
	}
	l.fields.Store(set)
}

// line formats a record as docs/observability.md "Access log" describes.
func (l *accessLog) line(rec *accessRecord, sc *scratch) slog.Record {
	r := slog.NewRecord(rec.start, slog.LevelInfo, "request", 0)
	attrs := sc.attrs[:0]
	attrs = append(attrs, slog.String("request_id", rec.requestID))
	set := l.fields.Load()
	add := func(i int, a slog.Attr) {
		if set == 0 || set&(1<<i) != 0 {
			attrs = append(attrs, a)
		}
	}
	// The indexes are those of config.AccessLogFields.
	add(0, slog.String("route", rec.route))
	add(1, slog.String("method", rec.method))
	if rec.model != "" {
		add(2, slog.String("model", rec.model))
	}
	if rec.apiKey != "" {
		add(3, slog.String("api_key", rec.apiKey))
	}
	if rec.user != "" {
		add(4, slog.String("user", rec.user))
	}
	if rec.team != "" {
		add(5, slog.String("team", rec.team))
	}
	if rec.client != "" {
		add(6, slog.String("client", rec.client))
	}
	add(7, slog.Int("status", rec.status))
	add(8, slog.String("decision", rec.decision.String()))
	if rec.errCode != "" {
		add(9, slog.String("error", rec.errCode))
	}
	if rec.decision == refused {
		add(10, slog.Attr{Key: "refusal", Value: refusalValue(rec, sc)})
	}
	if rec.reserved > 0 {
		add(11, slog.Int64("tokens_reserved", rec.reserved))
	}
	if rec.settlement != notSettled {
		if rec.settlement == settledUsage {
			sc.usage = append(sc.usage[:0], slog.Int64("input", rec.used.Input), slog.Int64("output", rec.used.Output),
				slog.Int64("cached", rec.used.Cached))
			add(12, slog.Attr{Key: "usage", Value: slog.GroupValue(sc.usage...)})
		}
		add(13, slog.Attr{Key: "settlement", Value: settlementValue(rec, sc)})
	}
	if rec.upstream != "" {
		add(14, slog.String("upstream", rec.upstream))
	}
	if rec.upstreamID != "" {
		add(15, slog.String("upstream_request_id", rec.upstreamID))
	}
	if !rec.upstreamHeaders.IsZero() {
		add(16, slog.Float64("upstream_latency_ms", millis(rec.upstreamHeaders.Sub(rec.upstreamStart))))
	}
	add(17, slog.Float64("latency_ms", millis(rec.finished.Sub(rec.start))))
	add(18, slog.Int64("bytes_in", rec.bytesIn))
	add(19, slog.Int64("bytes_out", rec.bytesOut))
	if rec.traceID.IsValid() {
		add(20, slog.String("trace_id", rec.traceID.String()))
	}
	r.AddAttrs(attrs...)
	sc.attrs = attrs
	return r
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// scratch holds the writer's attribute slices, reused from line to line: the handler
// is done with a line's attributes when Handle returns.
type scratch struct {
	attrs, usage, refusal, settlement []slog.Attr
}

// refusalValue names what refused: the limit type, the dimension and period or the
// caller's own rule and window, and the wait. A shared rule's name is never written.
func refusalValue(rec *accessRecord, sc *scratch) slog.Value {
	attrs := sc.refusal[:0]
	defer func() { sc.refusal = attrs }()
	if rec.queue || rec.refusal == nil {
		attrs = append(attrs, slog.String("limit", "queue"), slog.Int64("retry_after_seconds", rec.retryAfterSecond))
		return slog.GroupValue(attrs...)
	}
	r := rec.refusal
	switch {
	case r.Rule != "":
		attrs = append(attrs, slog.String("limit", "rule"), slog.String("dimension", r.Dimension.String()),
			slog.String("window", r.Window))
		if r.Scoped {
			attrs = append(attrs, slog.String("rule", r.Rule))
		}
	case r.Requests:
		attrs = append(attrs, slog.String("limit", "requests"), slog.String("dimension", r.Dimension.String()))
	default:
		attrs = append(attrs, slog.String("limit", "token_budget"), slog.String("dimension", r.Dimension.String()),
			slog.String("period", r.Period.String()))
	}
	attrs = append(attrs, slog.Int64("retry_after_seconds", rec.retryAfterSecond))
	if r.LargerThanBucket {
		attrs = append(attrs, slog.Bool("larger_than_budget", true))
	}
	return slog.GroupValue(attrs...)
}

// settlementValue is how the hold ended, with the tokens refunded or charged over the
// reservation, and what of the overage went into debt.
func settlementValue(rec *accessRecord, sc *scratch) slog.Value {
	attrs := sc.settlement[:0]
	attrs = append(attrs, slog.String("outcome", settlementNames[rec.settlement]))
	defer func() { sc.settlement = attrs }()
	if rec.settlement == released {
		attrs = append(attrs, slog.Int64("refund", rec.reserved))
		return slog.GroupValue(attrs...)
	}
	used := rec.used.Input + rec.used.Output
	if rec.settlement == settledReserved {
		used = rec.reserved
	}
	if rec.end == usage.Cut {
		attrs = append(attrs, slog.Bool("cut", true))
	}
	attrs = append(attrs, slog.Int64("refund", max(rec.reserved-used, 0)), slog.Int64("overage", max(used-rec.reserved, 0)))
	if debt := int64(math.Round(rec.debt)); debt > 0 {
		attrs = append(attrs, slog.Int64("debt", debt))
	}
	if rec.debtDollars > 0 {
		attrs = append(attrs, slog.Float64("debt_usd", rec.debtDollars))
	}
	return slog.GroupValue(attrs...)
}

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
func (ex *exchange) begin(w http.ResponseWriter, r *http.Request) *http.Request {
	rec := &ex.rec
	rec.start = time.Now()
	rec.method = r.Method
	rec.route = ex.route.name
	id, same := requestID(r)
	rec.requestID = id
	v := []string{id}
	w.Header()[RequestIDHeader] = v
	if !same {
		r.Header[forwardedIDHeader] = v
	}
	if ex.s.tracing != nil {
		r = ex.s.tracing.start(ex, r)
	}
	return r
}

// admitted records admission's outcome.
func (ex *exchange) admitted(id *budget.Identity, dec *budget.Decision) {
	rec := &ex.rec
	rec.client = id.Client
	switch {
	case id.Exempt || (id.Key != nil && id.Key.Bypass):
		rec.decision = exempt
	case dec.Refusal != nil:
		rec.decision = refused
		rec.refusal = dec.Refusal
	case dec.FailedOpen:
		rec.decision = failedOpen
	default:
		rec.decision = admitted
	}
	if dec.Hold != nil {
		rec.reserved = ex.est.Total()
	}
}

// observe ends a request's record: the access log line, the refusal audit and the
// server span. It runs once the request is answered.
func (s *Server) observe(ex *exchange, rt *runtime) {
	rec := &ex.rec
	rec.finished = time.Now()
	rec.status = ex.status
	rec.bytesOut = ex.cw.n
	rec.model = ex.est.Model
	if ex.upstream != nil {
		rec.upstream = ex.upstream.name
	}
	if ex.span != nil {
		s.tracing.end(ex)
	}
	if rec.decision == refused && rt != nil {
		s.audit.add(rt, ex)
	}
	switch {
	case rt == nil || rt.cfg.Observability.AccessLog.Disabled:
		rec.unlogged = true
	case rec.status < 400:
		if p := rt.cfg.Observability.AccessLog.Sample(); p < 1 && rand.Float64() >= p {
			rec.unlogged = true
		}
	}
	if ex.settling {
		if !rec.unlogged {
			// The line is pending until the settlement is told: a flush waits for it.
			s.access.pending.Add(1)
		}
		if ex.arrived.Add(1) < 2 {
			// The store is still settling: Settled writes the line.
			return
		}
	}
	s.writeLine(ex)
}

// Settled implements budget.SettleReceiver: the store has settled the request's hold.
// The line is written by the last of Settled and observe, so it carries the debt
// without the request waiting for a store that settles off its goroutine.
func (ex *exchange) Settled(st budget.Settlement) {
	ex.rec.debt, ex.rec.debtDollars = st.Debt, st.DebtDollars
	if ex.arrived.Add(1) == 2 {
		ex.s.writeLine(ex)
	}
}

// writeLine puts the request's line in the access log's buffer, unless it is unlogged.
func (s *Server) writeLine(ex *exchange) {
	if ex.rec.unlogged {
		return
	}
	s.access.send(&ex.rec)
	if ex.settling {
		s.access.pending.Add(-1)
	}
}

// observeApply takes a new config's access log fields and refusal audit bounds.
func (s *Server) observeApply(rt *runtime) {
	s.access.setFields(rt.cfg.Observability.AccessLog.Fields)
	s.audit.prune(rt)
}

// FlushAccessLog waits until every access log line buffered is written, or ctx ends;
// a stopping proxy calls it once no request is in flight.
func (s *Server) FlushAccessLog(ctx context.Context) { s.access.flush(ctx) }

// upstreamAnswered records the upstream's answer: when its headers came, and its own
// request id. A proxy id the upstream echoes is not sent twice.
func (ex *exchange) upstreamAnswered(h http.Header) {
	ex.rec.upstreamHeaders = time.Now()
	if v := h.Get(forwardedIDHeader); v != "" {
		ex.rec.upstreamID = v
	}
	delete(h, RequestIDHeader)
}
