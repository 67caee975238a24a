// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package usage reads the token usage a backend reports as the response passes
// through, from a JSON body or a server-sent-events stream of any size, with bounded
// memory. It knows OpenAI chat and completions (usage.prompt_tokens,
// completion_tokens), the Responses API (usage.input_tokens, output_tokens, in the body
// or in response.completed) and Anthropic messages (message_start usage plus
// message_delta usage, cache fields included). It also counts the generated text it
// sees, and says how a response's reservation ends: settled on the usage, released,
// or kept whole.
package usage

import "bytes"

// Usage is what a backend reported, or what was counted, for one request.
type Usage struct {
	// Input counts every input token the backend read, cached ones included.
	Input int64
	// Output counts the generated tokens.
	Output int64
	// Cached counts the input tokens read from the backend's prompt cache, a part of
	// Input: OpenAI's usage.prompt_tokens_details.cached_tokens, the Responses API's
	// usage.input_tokens_details.cached_tokens, Anthropic's cache_read_input_tokens.
	Cached int64
	// Found is true when the backend reported usage.
	Found bool
}

// Total is the tokens the request consumed.
func (u Usage) Total() int64 { return u.Input + u.Output }

// End is how a response body ended.
type End uint8

const (
	// Complete means the upstream sent the whole body and every byte was read.
	Complete End = iota
	// Cut means the body stopped early: the client went away or the upstream broke off.
	Cut
	// Unreadable means bytes of the body could not be decoded (a corrupt compressed body).
	Unreadable
)

// Verdict is how a response's reservation ends.
type Verdict uint8

const (
	// Release returns the whole reservation: the upstream produced no output.
	Release Verdict = iota
	// Settle replaces the reservation with the Usage.
	Settle
	// Reserve keeps the whole reservation: the upstream produced output whose usage
	// cannot be read.
	Reserve
)

// FromJSON reads the usage a non-streamed response body reports.
func FromJSON(body []byte) Usage {
	var b Body
	_, _ = b.Write(body)
	return b.Usage()
}

// Body follows a non-streamed JSON response as it passes through Write, keeping only
// the usage it reports and a count of the text it carries.
type Body struct {
	sc     scanner
	init   bool
	closed bool
	valid  bool
}

// Reset makes b ready for a new body, so that a reader can be reused.
func (b *Body) Reset() { *b = Body{sc: scanner{kindsX: b.sc.kindsX[:0]}} }

// Write feeds bytes of the body; it never fails.
func (b *Body) Write(p []byte) (int, error) {
	if !b.init {
		b.sc.reset(bodyTree)
		b.init = true
	}
	b.sc.write(p)
	return len(p), nil
}

// Usage is the usage the body reported, if any.
func (b *Body) Usage() Usage {
	var u Usage
	var cache [3]int64
	var input int64
	for i := 0; i < b.sc.nreports; i++ {
		b.sc.reports[i].merge(&u, &cache, &input)
	}
	return u
}

// Settlement says how the reservation of a response with this body ends, given its
// input estimate and how the body ended:
//   - a whole JSON body settles on its usage, or, when it reports none, on the input
//     estimate plus the text it carries;
//   - a body cut after its usage settles on that usage; cut after some text and before
//     its usage, on the input estimate plus that text; cut before any text, it is
//     released;
//   - a body that is not JSON, or cannot be decoded, keeps its whole reservation; an
//     empty one is released.
func (b *Body) Settlement(inputEstimate int64, end End) (Usage, Verdict) {
	if !b.closed {
		b.closed = true
		b.valid = b.sc.finish()
	}
	u := b.Usage()
	counted := Usage{Input: inputEstimate, Output: b.sc.tokens[clsText]}
	switch {
	case b.valid:
		if u.Found {
			return u, Settle
		}
		return counted, Settle
	case u.Found:
		return u, Settle
	case end == Cut:
		if b.sc.any[clsText] {
			return counted, Settle
		}
		return Usage{}, Release
	case end == Complete && !b.sc.started && !b.sc.bad:
		return Usage{}, Release
	}
	return Usage{}, Reserve
}

// Stream follows a server-sent-events response as it passes through Write. It never
// holds a line: each data line is scanned as it arrives.
type Stream struct {
	sc   scanner
	line uint8
	// pos counts the bytes of "data:" matched at the start of a line.
	pos int
	// done counts the bytes of "[DONE]" matched in a data line; -1 when it is not.
	done int

	u     Usage
	cache [3]int64
	input int64
	// final is true once a usage report other than message_start's arrived.
	final bool
	// deltas estimates the generated text seen.
	deltas int64
	// produced is true once the stream carried output: a delta, or a final report
	// of output tokens.
	produced bool
	// ended is true once the stream's own end marker arrived: data: [DONE] (OpenAI),
	// message_stop (Anthropic), response.completed or response.incomplete (Responses).
	ended bool
	// failed is true when the stream reported an error event.
	failed bool
}

// Line states.
const (
	lnStart uint8 = iota // matching "data:"
	lnLead               // after "data:", before the value
	lnData               // in the value
	lnSkip               // in a line that is not data
)

// Reset makes s ready for a new stream, so that a reader can be reused.
func (s *Stream) Reset() { *s = Stream{sc: scanner{kindsX: s.sc.kindsX[:0]}} }

// Write feeds bytes of the stream; it never fails.
func (s *Stream) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		switch s.line {
		case lnStart:
			switch p[0] {
			case '\n':
				s.pos = 0
				p = p[1:]
			case "data:"[s.pos]:
				p = p[1:]
				if s.pos++; s.pos == len("data:") {
					s.line = lnLead
				}
			default:
				s.line = lnSkip
			}
		case lnSkip:
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				return n, nil
			}
			p = p[i+1:]
			s.line, s.pos = lnStart, 0
		case lnLead:
			switch p[0] {
			case ' ', '\t':
				p = p[1:]
			case '\n':
				p = p[1:]
				s.line, s.pos = lnStart, 0
			default:
				s.line, s.done = lnData, 0
				s.sc.reset(streamTree)
			}
		case lnData:
			i := bytes.IndexByte(p, '\n')
			chunk := p
			if i >= 0 {
				chunk = p[:i]
			}
			s.matchDone(chunk)
			s.sc.write(chunk)
			if i < 0 {
				return n, nil
			}
			p = p[i+1:]
			s.endEvent()
			s.line, s.pos = lnStart, 0
		}
	}
	return n, nil
}

// matchDone follows OpenAI's end marker, [DONE], through a data line.
func (s *Stream) matchDone(p []byte) {
	const marker = "[DONE]"
	for _, c := range p {
		switch {
		case s.done < 0:
			return
		case s.done < len(marker) && c == marker[s.done]:
			s.done++
		case s.done == len(marker) && (c == ' ' || c == '\t' || c == '\r'):
		default:
			s.done = -1
		}
	}
}

// endEvent applies a data line that held one whole JSON value; anything else is
// ignored.
func (s *Stream) endEvent() {
	if s.done == len("[DONE]") {
		s.ended = true
		return
	}
	sc := &s.sc
	if !sc.finish() {
		return
	}
	for i := 0; i < sc.nreports; i++ {
		r := &sc.reports[i]
		r.merge(&s.u, &s.cache, &s.input)
		if !r.start {
			s.final = true
			if r.has&(1<<fCompletion|1<<fOutput) != 0 && s.u.Output > 0 {
				s.produced = true
			}
		}
	}
	tokens, any := sc.tokens[clsText], sc.any[clsText]
	// A delta string is text in the Responses API, except base64 audio.
	if sc.any[clsDelta] && sc.typN <= maxType && bytes.HasSuffix(sc.typ[:sc.typN], []byte(".delta")) && !sc.typeIs("response.audio.delta") {
		tokens, any = tokens+sc.tokens[clsDelta], true
	}
	if any {
		// At least one token for each event that carried text.
		s.deltas += max(tokens, 1)
		s.produced = true
	}
	switch {
	case sc.typeIs("message_stop"), sc.typeIs("response.completed"), sc.typeIs("response.incomplete"):
		s.ended = true
	case sc.typeIs("error"), sc.typeIs("response.failed"):
		s.failed = true
	}
}

// Ended reports whether the stream reached its own end marker without an error event.
func (s *Stream) Ended() bool { return s.ended && !s.failed }

// Usage is the usage the stream reported, if any.
func (s *Stream) Usage() Usage { return s.u }

// Final is what a normally ended stream settles on: the reported usage, or the input
// estimate plus the counted deltas when the backend reported none. When the only
// report is message_start's, its provisional output count is raised to the deltas.
func (s *Stream) Final(inputEstimate int64) Usage {
	switch {
	case s.u.Found && s.final:
		return s.u
	case s.u.Found:
		return Usage{Input: s.u.Input, Output: max(s.u.Output, s.deltas), Cached: s.u.Cached, Found: true}
	}
	return Usage{Input: inputEstimate, Output: s.deltas, Found: true}
}

// Settlement says how the reservation of a streamed response ends, given its input
// estimate and how the body ended:
//   - a stream that reached its end marker, or that stopped early (cut, or an error
//     event) after it carried output, settles on Final: what it reported, or what was
//     counted;
//   - one that stopped before any output is released, unless bytes of it could not be
//     decoded: it then keeps its whole reservation.
func (s *Stream) Settlement(inputEstimate int64, end End) (Usage, Verdict) {
	switch {
	case s.Ended(), s.produced:
		return s.Final(inputEstimate), Settle
	case end == Unreadable:
		return Usage{}, Reserve
	}
	return Usage{}, Release
}
