// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package accesslog

import (
	"context"
	"encoding/hex"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// Writer writes access log lines off the request path: a request puts its record
// in a bounded buffer and never waits; a record that finds the buffer full is
// dropped and counted. One goroutine formats the lines, straight into a buffer it
// reuses (no log/slog handler: its attribute values cost the writer about as much
// as the proxy's own work per request), and writes what it has formatted once the
// buffer has no more records waiting.
type Writer struct {
	ch      chan Record
	out     io.Writer
	m       *metrics.Observability
	pending atomic.Int64
	// fields is the bit set of AccessLogFields written, by their index; all when 0.
	fields atomic.Uint64
}

// New starts a writer to out (default os.Stdout) with at most buffer lines waiting
// (default config.DefaultAccessLogBufferLines); m counts the lines.
func New(out io.Writer, buffer int, m *metrics.Observability) *Writer {
	if out == nil {
		out = os.Stdout
	}
	if buffer <= 0 {
		buffer = config.DefaultAccessLogBufferLines
	}
	l := &Writer{ch: make(chan Record, buffer), out: out, m: m}
	go l.run()
	return l
}

// Send puts a record in the buffer, or drops it when the buffer is full.
func (l *Writer) Send(rec *Record) {
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

func (l *Writer) run() {
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
func (l *Writer) drain(buf []byte, n int) ([]byte, int, bool) {
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
func (l *Writer) write(buf []byte, n int) {
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

// Stop ends the writer once the lines buffered are written.
func (l *Writer) Stop() { close(l.ch) }

// Expect counts a line that will be sent later as pending, so that Flush waits for it.
func (l *Writer) Expect() { l.pending.Add(1) }

// Arrived ends an Expect once its line is sent.
func (l *Writer) Arrived() { l.pending.Add(-1) }

// Flush waits until every buffered or expected line is written, or ctx ends.
func (l *Writer) Flush(ctx context.Context) {
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

// SetFields selects the fields written; empty selects them all.
func (l *Writer) SetFields(names []string) {
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
func (l *Writer) line(b []byte, rec *Record) []byte {
	set := l.fields.Load()
	// want reports whether field i of config.AccessLogFields is written.
	want := func(i int) bool { return set == 0 || set&(1<<i) != 0 }
	b = append(b, `{"time":"`...)
	b = rec.Start.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"request","request_id":`...)
	b = appendJSONString(b, rec.RequestID)
	if want(0) {
		b = appendStringField(b, "route", rec.Route)
	}
	if want(1) {
		b = appendStringField(b, "method", rec.Method)
	}
	if rec.Model != "" && want(2) {
		b = appendStringField(b, "model", rec.Model)
	}
	if rec.APIKey != "" && want(3) {
		b = appendStringField(b, "api_key", rec.APIKey)
	}
	if rec.User != "" && want(4) {
		b = appendStringField(b, "user", rec.User)
	}
	if rec.Team != "" && want(5) {
		b = appendStringField(b, "team", rec.Team)
	}
	if rec.Client != "" && want(6) {
		b = appendStringField(b, "client", rec.Client)
	}
	if want(7) {
		b = appendIntField(b, "status", int64(rec.Status))
	}
	if want(8) {
		b = appendStringField(b, "decision", rec.Decision.String())
	}
	if rec.ErrCode != "" && want(9) {
		b = appendStringField(b, "error", rec.ErrCode)
	}
	if rec.Decision == Refused && want(10) {
		b = appendRefusal(b, rec)
	}
	if rec.Reserved > 0 && want(11) {
		b = appendIntField(b, "tokens_reserved", rec.Reserved)
	}
	if rec.Settlement != NotSettled {
		if rec.Settlement == SettledUsage && want(12) {
			b = append(b, `,"usage":{"input":`...)
			b = strconv.AppendInt(b, rec.Used.Input, 10)
			b = appendIntField(b, "output", rec.Used.Output)
			b = appendIntField(b, "cached", rec.Used.Cached)
			b = append(b, '}')
		}
		if want(13) {
			b = appendSettlement(b, rec)
		}
	}
	if rec.Upstream != "" && want(14) {
		b = appendStringField(b, "upstream", rec.Upstream)
	}
	if rec.UpstreamID != "" && want(15) {
		b = appendStringField(b, "upstream_request_id", rec.UpstreamID)
	}
	if !rec.UpstreamHeaders.IsZero() && want(16) {
		b = appendFloatField(b, "upstream_latency_ms", millis(rec.UpstreamHeaders.Sub(rec.UpstreamStart)))
	}
	if want(17) {
		b = appendFloatField(b, "latency_ms", millis(rec.Finished.Sub(rec.Start)))
	}
	if want(18) {
		b = appendIntField(b, "bytes_in", rec.BytesIn)
	}
	if want(19) {
		b = appendIntField(b, "bytes_out", rec.BytesOut)
	}
	if rec.TraceID.IsValid() && want(20) {
		b = append(b, `,"trace_id":"`...)
		b = hex.AppendEncode(b, rec.TraceID[:])
		b = append(b, '"')
	}
	if rec.Cache != "" && want(21) {
		b = appendStringField(b, "cache", rec.Cache)
	}
	if rec.OutputAdmitted > 0 && want(22) {
		b = appendIntField(b, "output_admitted", rec.OutputAdmitted)
	}
	if rec.Cache == "hit" && want(23) {
		b = appendIntField(b, "cache_age_seconds", rec.CacheAge)
	}
	return append(b, "}\n"...)
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// appendRefusal names what refused: the limit type, the dimension and period or the
// caller's own rule and window, and the wait. A shared rule's name is never written.
func appendRefusal(b []byte, rec *Record) []byte {
	b = append(b, `,"refusal":{"limit":`...)
	r := rec.Refusal
	switch {
	case rec.LedgerFull:
		b = appendJSONString(b, "ledger")
	case rec.Queue || r == nil:
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
	b = appendIntField(b, "retry_after_seconds", rec.RetryAfterSecond)
	if r != nil && !rec.Queue && !rec.LedgerFull && r.LargerThanBucket {
		b = append(b, `,"larger_than_budget":true`...)
	}
	return append(b, '}')
}

// appendSettlement is how the hold ended, with the tokens refunded or charged over the
// reservation, and what of the overage went into debt.
func appendSettlement(b []byte, rec *Record) []byte {
	b = append(b, `,"settlement":{"outcome":`...)
	b = appendJSONString(b, rec.Settlement.String())
	if rec.Settlement == Released {
		b = appendIntField(b, "refund", rec.Reserved)
		return append(b, '}')
	}
	used := rec.Used.Input + rec.Used.Output
	if rec.Settlement == SettledReserved {
		used = rec.Reserved
	}
	if rec.End == usage.Cut {
		b = append(b, `,"cut":true`...)
	}
	b = appendIntField(b, "refund", max(rec.Reserved-used, 0))
	b = appendIntField(b, "overage", max(used-rec.Reserved, 0))
	if debt := int64(math.Round(rec.Debt)); debt > 0 {
		b = appendIntField(b, "debt", debt)
	}
	if rec.DebtDollars > 0 {
		b = appendFloatField(b, "debt_usd", rec.DebtDollars)
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
