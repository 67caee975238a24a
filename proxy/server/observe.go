// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"encoding/hex"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

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
	// start and finished are the request's arrival and end; upstreamStart and
	// upstreamHeaders time the upstream call of its last attempt: forwarded, answered.
	// All come from the server's clock.
	upstreamStart   time.Time
	upstreamHeaders time.Time
	upstreamID      string
	finished        time.Time
	bytesIn         int64
	bytesOut        int64
	status          int
	route           string
	model           string
	apiKey          string
	user, team      string
	// upstream is the upstream the request was last handed to (handOff); empty when
	// nothing was forwarded.
	upstream         string
	reserved         int64
	traceID          trace.TraceID
	retryAfterSecond int64
}

// accessLog writes access log lines off the request path: a request puts its record
// in a bounded buffer and never waits; a record that finds the buffer full is
// dropped and counted. One goroutine formats the lines, straight into a buffer it
// reuses (no log/slog handler: its attribute values cost the writer about as much
// as the proxy's own work per request), and writes what it has formatted once the
// buffer has no more records waiting.
type accessLog struct {
	ch      chan accessRecord
	out     io.Writer
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
	l := &accessLog{ch: make(chan accessRecord, buffer), out: out, m: m}
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

// maxBatch bounds the bytes formatted before a write.
const maxBatch = 64 << 10

// batchInterval is how long the writer lets records gather while requests keep
// coming. A request never wakes a writer that is gathering: waking a goroutine costs
// the request a futex call and the other core a switch, several microseconds, more
// than formatting its line. A writer that found nothing in an interval parks until
// the next record, so an idle proxy spends nothing on its log.
const batchInterval = 10 * time.Millisecond

func (l *accessLog) run() {
	var buf []byte
	for {
		rec, ok := <-l.ch
		if !ok {
			return
		}
		buf = l.line(buf[:0], &rec)
		n := 1
		for {
			var closed bool
			buf, n, closed = l.drain(buf, n)
			l.write(buf, n)
			if closed {
				return
			}
			buf, n = buf[:0], 0
			time.Sleep(batchInterval)
			if len(l.ch) == 0 {
				break
			}
		}
	}
}

// drain formats the records waiting, while the batch has room; closed reports that
// the log was stopped.
func (l *accessLog) drain(buf []byte, n int) ([]byte, int, bool) {
	for {
		if len(buf) >= maxBatch {
			l.write(buf, n)
			buf, n = buf[:0], 0
		}
		select {
		case rec, ok := <-l.ch:
			if !ok {
				return buf, n, true
			}
			buf = l.line(buf, &rec)
			n++
		default:
			return buf, n, false
		}
	}
}

// write writes n formatted lines.
func (l *accessLog) write(buf []byte, n int) {
	if n == 0 {
		return
	}
	if _, err := l.out.Write(buf); err != nil {
		l.m.Failed.Add(float64(n))
	} else {
		l.m.Written.Add(float64(n))
	}
	l.pending.Add(-int64(n))
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

// line appends a record's line, as docs/observability.md "Access log" describes: one
// JSON object and a newline, with the time, level and msg of a log/slog JSON line.
func (l *accessLog) line(b []byte, rec *accessRecord) []byte {
	set := l.fields.Load()
	// want reports whether field i of config.AccessLogFields is written.
	want := func(i int) bool { return set == 0 || set&(1<<i) != 0 }
	b = append(b, `{"time":"`...)
	b = rec.start.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"request","request_id":`...)
	b = appendJSONString(b, rec.requestID)
	if want(0) {
		b = appendStringField(b, "route", rec.route)
	}
	if want(1) {
		b = appendStringField(b, "method", rec.method)
	}
	if rec.model != "" && want(2) {
		b = appendStringField(b, "model", rec.model)
	}
	if rec.apiKey != "" && want(3) {
		b = appendStringField(b, "api_key", rec.apiKey)
	}
	if rec.user != "" && want(4) {
		b = appendStringField(b, "user", rec.user)
	}
	if rec.team != "" && want(5) {
		b = appendStringField(b, "team", rec.team)
	}
	if rec.client != "" && want(6) {
		b = appendStringField(b, "client", rec.client)
	}
	if want(7) {
		b = appendIntField(b, "status", int64(rec.status))
	}
	if want(8) {
		b = appendStringField(b, "decision", rec.decision.String())
	}
	if rec.errCode != "" && want(9) {
		b = appendStringField(b, "error", rec.errCode)
	}
	if rec.decision == refused && want(10) {
		b = appendRefusal(b, rec)
	}
	if rec.reserved > 0 && want(11) {
		b = appendIntField(b, "tokens_reserved", rec.reserved)
	}
	if rec.settlement != notSettled {
		if rec.settlement == settledUsage && want(12) {
			b = append(b, `,"usage":{"input":`...)
			b = strconv.AppendInt(b, rec.used.Input, 10)
			b = appendIntField(b, "output", rec.used.Output)
			b = appendIntField(b, "cached", rec.used.Cached)
			b = append(b, '}')
		}
		if want(13) {
			b = appendSettlement(b, rec)
		}
	}
	if rec.upstream != "" && want(14) {
		b = appendStringField(b, "upstream", rec.upstream)
	}
	if rec.upstreamID != "" && want(15) {
		b = appendStringField(b, "upstream_request_id", rec.upstreamID)
	}
	if !rec.upstreamHeaders.IsZero() && want(16) {
		b = appendFloatField(b, "upstream_latency_ms", millis(rec.upstreamHeaders.Sub(rec.upstreamStart)))
	}
	if want(17) {
		b = appendFloatField(b, "latency_ms", millis(rec.finished.Sub(rec.start)))
	}
	if want(18) {
		b = appendIntField(b, "bytes_in", rec.bytesIn)
	}
	if want(19) {
		b = appendIntField(b, "bytes_out", rec.bytesOut)
	}
	if rec.traceID.IsValid() && want(20) {
		b = append(b, `,"trace_id":"`...)
		b = hex.AppendEncode(b, rec.traceID[:])
		b = append(b, '"')
	}
	return append(b, "}\n"...)
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// appendRefusal names what refused: the limit type, the dimension and period or the
// caller's own rule and window, and the wait. A shared rule's name is never written.
func appendRefusal(b []byte, rec *accessRecord) []byte {
	b = append(b, `,"refusal":{"limit":`...)
	r := rec.refusal
	switch {
	case rec.queue || r == nil:
		b = appendJSONString(b, "queue")
	case r.Rule != "":
		b = appendJSONString(b, "rule")
		b = appendStringField(b, "dimension", r.Dimension.String())
		b = appendStringField(b, "window", r.Window)
		if r.Scoped {
			b = appendStringField(b, "rule", r.Rule)
		}
	case r.Requests:
		b = appendJSONString(b, "requests")
		b = appendStringField(b, "dimension", r.Dimension.String())
	default:
		b = appendJSONString(b, "token_budget")
		b = appendStringField(b, "dimension", r.Dimension.String())
		b = appendStringField(b, "period", r.Period.String())
	}
	b = appendIntField(b, "retry_after_seconds", rec.retryAfterSecond)
	if r != nil && !rec.queue && r.LargerThanBucket {
		b = append(b, `,"larger_than_budget":true`...)
	}
	return append(b, '}')
}

// appendSettlement is how the hold ended, with the tokens refunded or charged over the
// reservation, and what of the overage went into debt.
func appendSettlement(b []byte, rec *accessRecord) []byte {
	b = append(b, `,"settlement":{"outcome":`...)
	b = appendJSONString(b, settlementNames[rec.settlement])
	if rec.settlement == released {
		b = appendIntField(b, "refund", rec.reserved)
		return append(b, '}')
	}
	used := rec.used.Input + rec.used.Output
	if rec.settlement == settledReserved {
		used = rec.reserved
	}
	if rec.end == usage.Cut {
		b = append(b, `,"cut":true`...)
	}
	b = appendIntField(b, "refund", max(rec.reserved-used, 0))
	b = appendIntField(b, "overage", max(used-rec.reserved, 0))
	if debt := int64(math.Round(rec.debt)); debt > 0 {
		b = appendIntField(b, "debt", debt)
	}
	if rec.debtDollars > 0 {
		b = appendFloatField(b, "debt_usd", rec.debtDollars)
	}
	return append(b, '}')
}

func appendStringField(b []byte, key, v string) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return appendJSONString(b, v)
}

func appendIntField(b []byte, key string, v int64) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

func appendFloatField(b []byte, key string, v float64) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, v, 'f', -1, 64)
}

// appendJSONString appends s as a JSON string, escaped as encoding/json escapes it:
// quotes, backslashes and control characters escaped, <, > and & as \u escapes,
// invalid UTF-8 as U+FFFD, and U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
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
	rec.status = ex.status
	rec.bytesOut = ex.cw.n
	rec.model = ex.est.Model
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
// request id.
func (ex *exchange) upstreamAnswered(h http.Header) {
	ex.rec.upstreamHeaders = ex.s.clock.Now()
	if v := h.Get(forwardedIDHeader); v != "" {
		ex.rec.upstreamID = v
	}
}
