// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// Directives are a request's Cache-Control directives, with RFC 9111's meanings for
// a cache in front of an origin: no-cache skips the lookup and stores the fresh
// answer; no-store neither looks up nor stores; max-age=N accepts only an entry at
// most N seconds old. Pragma: no-cache counts as no-cache when there is no
// Cache-Control (RFC 9111 section 5.4).
type Directives struct {
	NoCache, NoStore bool
	// MaxAge is the oldest entry accepted; negative: any within the time to live.
	MaxAge time.Duration
}

// RequestDirectives reads the request's Cache-Control (and Pragma).
func RequestDirectives(h http.Header) Directives {
	d := Directives{MaxAge: -1}
	cc := h["Cache-Control"]
	if len(cc) == 0 {
		for _, p := range h["Pragma"] {
			if hasDirective(p, "no-cache") {
				d.NoCache = true
			}
		}
		return d
	}
	for _, line := range cc {
		for part := range strings.SplitSeq(line, ",") {
			name, arg, _ := strings.Cut(strings.TrimSpace(part), "=")
			switch strings.ToLower(strings.TrimSpace(name)) {
			case "no-cache":
				d.NoCache = true
			case "no-store":
				d.NoStore = true
			case "max-age":
				if s, err := strconv.ParseInt(strings.Trim(strings.TrimSpace(arg), `"`), 10, 64); err == nil && s >= 0 {
					d.MaxAge = time.Duration(min(s, 1<<31)) * time.Second
				}
			}
		}
	}
	return d
}

// Lookup reports whether the request may be answered from the store.
func (d Directives) Lookup() bool { return !d.NoCache && !d.NoStore }

// Store reports whether the request's answer may be stored.
func (d Directives) Store() bool { return !d.NoStore }

// Fresh reports whether an entry of that age may answer the request.
func (d Directives) Fresh(age time.Duration) bool { return d.MaxAge < 0 || age <= d.MaxAge }

func hasDirective(list, name string) bool {
	for part := range strings.SplitSeq(list, ",") {
		if strings.EqualFold(strings.TrimSpace(part), name) {
			return true
		}
	}
	return false
}

// Stateful reports whether a request changes state upstream, so that its answer must
// come from the upstream every time and no identical request may share it: a
// Responses call that is stored (store absent or true, the API's default), continues
// a stored response (previous_response_id) or a conversation, or runs in the
// background. st is what the body's estimate read of those fields; a body that is not
// a JSON object states none, and is read as stateful, never as shareable.
func Stateful(route string, st estimate.State) bool {
	if route != "/v1/responses" {
		return false
	}
	return st.Invalid || st.Store != estimate.False || st.PreviousResponse || st.Conversation ||
		st.Background == estimate.True
}

// Reasons an answer is not stored (the access log's and the metrics' values).
const (
	NotStoredStatus     = "status"     // not 2xx
	NotStoredCut        = "cut"        // the body or stream ended early
	NotStoredUnreadable = "unreadable" // its usage could not be read or counted
	NotStoredTooLarge   = "too_large"  // larger than max_entry_bytes
	NotStoredNoStore    = "no_store"   // the response said Cache-Control: no-store
	NotStoredEncoded    = "encoded"    // a body the proxy could not decode
)

// Recorder keeps a copy of a response as it passes to the client, bounded: past
// maxBytes it drops what it held and keeps nothing more, so a huge answer costs no
// memory and is never stored. For a stream it notes where each event ends. The zero
// Recorder is unused until Reset.
type Recorder struct {
	max    int
	stream bool
	body   []byte
	events []int32
	over   bool
	// call, when set, gets the answer as recorded (Share).
	call *Call
	// lineStart: the last byte ended a line, so a line feed now ends an event.
	lineStart bool
}

// NewRecorder records a response of at most maxBytes; stream says it is an event stream.
func NewRecorder(maxBytes int64, stream bool) *Recorder {
	r := &Recorder{}
	r.Reset(maxBytes, stream)
	return r
}

// Reset makes r a new recorder of at most maxBytes, as NewRecorder, so that a
// request's recorder needs no allocation of its own.
func (r *Recorder) Reset(maxBytes int64, stream bool) {
	*r = Recorder{max: int(min(maxBytes, 1<<31-1)), stream: stream}
}

// Share sends what r records to c's waiters: they read the recorder's own copy of
// the answer, so an answer both stored and coalesced is held once. Past maxBytes,
// when r drops its copy, c keeps its own.
func (r *Recorder) Share(c *Call) { r.call = c }

// Write records p; it never fails.
func (r *Recorder) Write(p []byte) (int, error) {
	if !r.over && len(r.body)+len(p) > r.max {
		r.over, r.body, r.events = true, nil, nil
	}
	if r.over {
		if r.call != nil {
			_, _ = r.call.Write(p)
		}
		return len(p), nil
	}
	start := len(r.body)
	r.body = append(r.body, p...)
	if r.stream {
		r.scan(start)
	}
	if r.call != nil {
		r.call.publish(r.body)
	}
	return len(p), nil
}

// scan notes the ends of the events in body[start:]: an event ends at an empty line
// ("\n\n" or "\r\n\r\n").
func (r *Recorder) scan(start int) {
	for i := start; i < len(r.body); i++ {
		switch r.body[i] {
		case '\n':
			if r.lineStart {
				r.events = append(r.events, int32(i+1))
			}
			r.lineStart = !r.lineStart
		case '\r':
		default:
			r.lineStart = false
		}
	}
}

// Answer is how the recorded response ended, as the server saw it.
type Answer struct {
	Status      int
	Header      http.Header
	End         usage.End
	Verdict     usage.Verdict
	Usage       usage.Usage
	Stored      time.Time
	DecodeError bool
}

// Entry is the entry to store for the answer, or the reason it must not be stored:
// only a complete 2xx answer whose usage was read or counted, within the size bound,
// that did not say no-store, is (the zero Entry and the reason otherwise). The body
// is handed over: the recorder never writes it again.
func (r *Recorder) Entry(a Answer) (Entry, string) {
	switch {
	case a.Status < 200 || a.Status > 299:
		return Entry{}, NotStoredStatus
	case a.End == usage.Cut:
		return Entry{}, NotStoredCut
	case a.DecodeError:
		return Entry{}, NotStoredEncoded
	case a.End != usage.Complete || a.Verdict != usage.Settle:
		return Entry{}, NotStoredUnreadable
	case r.over:
		return Entry{}, NotStoredTooLarge
	}
	for _, v := range a.Header["Cache-Control"] {
		if hasDirective(v, "no-store") {
			return Entry{}, NotStoredNoStore
		}
	}
	e := Entry{
		Status: a.Status, ContentType: headerFirst(a.Header, "Content-Type"),
		Body: r.body, Usage: a.Usage, Stored: a.Stored,
	}
	if r.stream {
		e.Events = r.events
		if e.Events == nil {
			e.Events = []int32{}
		}
	}
	r.body, r.events, r.call = nil, nil, nil
	return e, ""
}
