// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package estimate computes a request's token reservation without a tokenizer: an
// input estimate that walks every part of the prompt, plus the output ceiling the
// request states. docs/estimation.md gives the formula; it over-counts by construction
// and settlement refunds the difference. It reads a body as the upstream will:
// exactly as encoding/json decodes it (escapes in keys decoded, the last duplicate
// key wins), with saturating arithmetic and no recursion that a body controls.
package estimate

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
)

const (
	// DefaultOutput is the output ceiling of a request that states none.
	DefaultOutput = 4096
	// MessageFloor is the framing each message costs beyond its text (role, separators).
	MessageFloor = 4
	// MediaTokens is the least one media payload (an image, audio or a document) costs;
	// its bytes are not text, so they are not counted as text (see MediaCost).
	MediaTokens = 1600
	// MaxTokens is where every token count saturates: far beyond any budget, and
	// exact in a float64 bucket, so no arithmetic on an estimate can wrap.
	MaxTokens int64 = 1 << 50
	// BytesPerToken is the least the estimate charges for text: a token per four
	// decoded bytes (text.go charges more for digits, punctuation and emoji).
	BytesPerToken = 4
)

// Estimate is a request's reservation and the facts admission needs from its body.
type Estimate struct {
	// Input is the estimated input tokens.
	Input int64
	// Output is the output ceiling: the largest stated limit times the number of
	// completions asked for (prompts × the largest of n and best_of), or DefaultOutput.
	Output int64
	// InputLower is a lower bound of the input tokens, from the same walk: the tokens
	// that the text of the prompt's fields cannot do without under o200k_base or
	// cl100k_base (text.go), media, keys and message framing not counted. The
	// context-window pre-check reads it, so it must never exceed the real count;
	// budgets reserve Input. 0 when the body is not a JSON object.
	InputLower int64
	// OutputCap is the largest output the request states for one completion
	// (max_tokens, max_completion_tokens or max_output_tokens); 0 when it states none.
	OutputCap int64
	// Model is the request's model name; empty when absent.
	Model string
	// Stream is true when the request asks for a streamed response.
	Stream bool
	// Parsed is false when the body is not a JSON object; the estimate is then the
	// conservative fallback.
	Parsed bool
	// Tokenized: Input and InputLower are a model's tokenizer's count (Tokenized),
	// which a rewrite of the body's output limits leaves as they are.
	Tokenized bool

	// State is what a Responses body says of the state the call keeps upstream.
	State State

	// moved says a rewrite moved the output limits; empty that the object has no
	// member (Renamed).
	moved, empty bool
	// models is how many top-level model values the body has: 0, 1 (its span is
	// model) or more (all their spans are in spill).
	models uint8
	// limits are the body's top-level output limits, every occurrence in order (n of
	// them; past len(limits), all are in spill).
	n      int32
	limits [2]OutputLimit
	model  Span
	spill  *spill
	// mult is what one completion's limit is multiplied by (prompts × the largest of n
	// and best_of).
	mult int64
	// view is every value of the body, when asked for (BodyView).
	view *View
}

// spill holds what a body states more often than an estimate keeps in place.
type spill struct {
	limits []OutputLimit
	models []Span
}

// own is e's spill, copied so that changing it changes no other copy of e.
func (e *Estimate) own() *spill {
	if e.spill == nil {
		e.spill = &spill{}
		return e.spill
	}
	c := &spill{limits: append([]OutputLimit(nil), e.spill.limits...), models: append([]Span(nil), e.spill.models...)}
	e.spill = c
	return c
}

// OutputLimit is one top-level output limit of a body: its field, the limit it states
// (Ceiling), and where its value's bytes are.
type OutputLimit struct {
	Field      string
	Value      int64
	Start, End int32
	// key and value are the input tokens of its key and of its value.
	key, value int64
}

// The output limits' fields.
const (
	FieldMaxTokens           = "max_tokens"
	FieldMaxCompletionTokens = "max_completion_tokens"
	FieldMaxOutputTokens     = "max_output_tokens"
)

// Tokenize sets a model's tokenizer's count of the input: input, the budget's
// reservation (the text's count plus the estimate's allowances for media and
// framing), and text, the text's count alone, which the context window reads.
func (e *Estimate) Tokenize(input, text int64) {
	e.Input, e.InputLower, e.Tokenized = input, text, true
}

// OutputLimits are the body's top-level output limits, every occurrence in order; ok
// is false when the body is not a JSON object, or after WithOutputLimit (their
// offsets are the body's before its rewrite).
func (e *Estimate) OutputLimits() (limits []OutputLimit, ok bool) {
	if !e.Parsed || e.moved {
		return nil, false
	}
	return e.outputLimits(), true
}

// outputLimits are the output limits kept.
func (e *Estimate) outputLimits() []OutputLimit {
	if int(e.n) <= len(e.limits) {
		return e.limits[:e.n]
	}
	return e.spill.limits
}

// addLimit keeps an output limit.
func (e *Estimate) addLimit(l OutputLimit) {
	switch {
	case int(e.n) < len(e.limits):
		e.limits[e.n] = l
	case int(e.n) == len(e.limits):
		sp := e.own()
		sp.limits = append(append(sp.limits, e.limits[:]...), l)
	default:
		e.spill.limits = append(e.spill.limits, l)
	}
	e.n++
}

// WithOutputLimit is the estimate of the body rewritten to state limit as its output
// limit: each of its output limits above limit lowered to it or, when the body states
// none, field inserted with it (agentlimit.CapOutput), the body scanned once. It needs
// OutputLimits' ok, which the estimate it returns no longer has; the model's spans
// move with the rewrite (Renamed).
func (e Estimate) WithOutputLimit(field string, limit int64) Estimate {
	lit := []byte(strconv.FormatInt(limit, 10))
	litTokens := numberTokens(lit)
	e.rewriteModel(field, lit, limit)
	delta := int64(0)
	if e.n == 0 {
		e.limits[0] = OutputLimit{Field: field, Value: limit, key: textRaw([]byte(field)), value: litTokens}
		e.n = 1
		delta = satAdd(e.limits[0].key, litTokens)
	}
	if int(e.n) > len(e.limits) {
		e.own() // a copy's limits are its own
	}
	var tok, compl, out int64
	limits := e.outputLimits()
	for i := range limits {
		l := &limits[i]
		if l.Value > limit {
			delta += litTokens - l.value
			l.Value, l.value = limit, litTokens
		}
		switch l.Field {
		case FieldMaxTokens:
			tok = l.Value
		case FieldMaxCompletionTokens:
			compl = l.Value
		case FieldMaxOutputTokens:
			out = l.Value
		}
	}
	if !e.Tokenized {
		e.Input += delta
	}
	e.OutputCap = max(tok, compl, out)
	o := e.OutputCap
	if o <= 0 {
		o = DefaultOutput
	}
	e.Output = satMul(o, e.mult)
	e.moved = true
	return e
}

// rewriteModel moves the model's spans as WithOutputLimit's rewrite moves them: lit
// in place of each limit above limit, or "field":lit inserted as the first member.
func (e *Estimate) rewriteModel(field string, lit []byte, limit int64) {
	if e.n == 0 {
		member := len(`"":`) + len(field) + len(lit)
		if !e.empty {
			member++ // its comma
		}
		e.shift(0, member) // every span is after the opening brace
		e.empty = false
		return
	}
	limits := e.outputLimits()
	for i := len(limits) - 1; i >= 0; i-- {
		if l := limits[i]; l.Value > limit {
			e.shift(int(l.End), len(lit)-int(l.End-l.Start))
		}
	}
}

// Total is the reservation: input estimate plus output ceiling, with no margin.
func (e Estimate) Total() int64 { return satAdd(e.Input, e.Output) }

// Body estimates a request body in one pass. A body that is not a JSON object gets
// the conservative fallback: one token per three bytes plus the default output
// ceiling. A body nested deeper than MaxDepth is an error (ErrTooDeep): the caller
// refuses it, as upstreams do.
func Body(body []byte) (Estimate, error) {
	return body1(body, false)
}

// BodyView is Body that also keeps every value of the body (Estimate.View), for a
// tokenizer to count without reading the JSON again.
func BodyView(body []byte) (Estimate, error) {
	return body1(body, viewable(body))
}

// View is every value of the body, when the estimate was made by BodyView of a JSON
// object; nil otherwise, or after DropView.
func (e *Estimate) View() *View { return e.view }

// DropView lets the view go once nothing needs it.
func (e *Estimate) DropView() { e.view = nil }

func body1(body []byte, view bool) (Estimate, error) {
	e, err := scanBody(body, view)
	switch {
	case err == nil:
		return e, nil
	case errors.Is(err, ErrTooDeep):
		return Estimate{}, err
	}
	return Estimate{Input: int64(len(body)+2) / 3, Output: DefaultOutput}, nil
}

// The top-level fields the estimate reads. A field given twice counts as its last
// occurrence, as the upstream decodes it.
const (
	fMessages = iota
	fInput
	fPrompt
	fInstructions
	fSystem
	fTools
	fFunctions
	fResponseFormat
	fText
	numTextFields
)

// textField is the field a top-level key names, or -1.
func textField(key []byte) int {
	switch string(key) {
	case "messages":
		return fMessages
	case "input":
		return fInput
	case "prompt":
		return fPrompt
	case "instructions":
		return fInstructions
	case "system":
		return fSystem
	case "tools":
		return fTools
	case "functions":
		return fFunctions
	case "response_format":
		return fResponseFormat
	case "text":
		return fText
	}
	return -1
}

func scanBody(body []byte, view bool) (Estimate, error) {
	s := &scanner{b: body}
	if view {
		s.view = &View{body: body, nodes: make([]node, 0, 64)}
	}
	e := Estimate{Parsed: true, empty: true}
	// Each field's last occurrence: its input tokens, and the numbers read from it;
	// lower is the part of those tokens that is text (InputLower).
	var fields, lower [numTextFields]int64
	var other int64 // every other field's text, all occurrences
	var maxTok, maxCompl, maxOut, n, bestOf int64
	prompts := int64(1)
	err := s.object(func(rawKey []byte) error {
		// A key with escapes is the key it decodes to; a plain key is used in place.
		key := rawKey
		if needsDecoding(rawKey) {
			key = []byte(decodeString(rawKey))
		}
		e.empty = false
		if f := textField(key); f >= 0 {
			raw, w, err := s.span(1)
			if err != nil {
				return err
			}
			v := satAdd(textRaw(rawKey), w.tokens)
			lower[f] = w.lower
			switch f {
			case fMessages, fInput:
				// Every message or item with its floor.
				v = satAdd(v, satMul(w.elems, MessageFloor))
			case fPrompt:
				prompts = max(w.prompts, 1)
			case fTools, fFunctions, fResponseFormat, fText:
				// Sent to the model as text: the whole JSON counts (text.format is
				// Responses' response_format).
				gen, low := textCounts(raw)
				v = max(v, satAdd(textRaw(rawKey), gen))
				lower[f] = low
			}
			fields[f] = v
			return nil
		}
		keyTokens := textRaw(rawKey)
		var target *int64
		switch string(key) {
		case "max_tokens":
			target = &maxTok
		case "max_completion_tokens":
			target = &maxCompl
		case "max_output_tokens":
			target = &maxOut
		case "n":
			target = &n
		case "best_of":
			target = &bestOf
		case "model":
			raw, w, err := s.span(1)
			if err != nil {
				return err
			}
			e.Model = ""
			if raw[0] == '"' {
				e.Model = decodeString(raw[1 : len(raw)-1])
			}
			e.addModel(Span{s.i - len(raw), s.i})
			other = satAdd(other, satAdd(keyTokens, w.tokens))
			return nil
		case "stream":
			raw, w, err := s.span(1)
			if err != nil {
				return err
			}
			e.Stream = string(raw) == "true"
			other = satAdd(other, satAdd(keyTokens, w.tokens))
			return nil
		}
		raw, w, err := s.span(1)
		if err != nil {
			return err
		}
		if mayBeStateKey(key) {
			e.State.read(key, raw)
		}
		if target != nil {
			*target = Ceiling(raw)
			if field := limitField(key); field != "" {
				e.addLimit(OutputLimit{Field: field, Value: *target, Start: int32(s.i - len(raw)), End: int32(s.i),
					key: keyTokens, value: w.tokens})
			}
		}
		other = satAdd(other, satAdd(keyTokens, w.tokens))
		return nil
	})
	if err != nil {
		return e, err
	}
	if s.ws(); s.i != len(s.b) {
		return e, errSyntax
	}
	e.view = s.view
	// The lower bound counts only the fields that are the prompt, each once: another
	// field given twice is read once by the upstream, and is not prompt text.
	in, low := other, int64(0)
	for f, v := range fields {
		in = satAdd(in, v)
		low = satAdd(low, lower[f])
	}
	out := max(maxTok, maxCompl, maxOut)
	e.OutputCap = out
	if out <= 0 {
		out = DefaultOutput
	}
	e.mult = satMul(prompts, max(n, bestOf, 1))
	out = satMul(out, e.mult)
	e.Input, e.Output, e.InputLower = in, out, low
	return e, nil
}

// limitField is the output limit a top-level key names, or "".
func limitField(key []byte) string {
	switch string(key) {
	case FieldMaxTokens:
		return FieldMaxTokens
	case FieldMaxCompletionTokens:
		return FieldMaxCompletionTokens
	case FieldMaxOutputTokens:
		return FieldMaxOutputTokens
	}
	return ""
}

// numberTokens are a plain number literal's input tokens, as the scan counts them.
func numberTokens(lit []byte) int64 {
	s := &scanner{b: lit}
	_, w, err := s.span(1)
	if err != nil {
		return 0
	}
	return w.tokens
}

// Text is the generous count of a string's text (text.go): a quarter token per ASCII
// letter or space, a third per punctuation mark or digit and two more per run of
// digits, a token per other character of up to three bytes and three per character
// of four. A byte that is not valid UTF-8 counts as a character.
func Text(s string) int64 {
	gen, _ := textCounts([]byte(s))
	return gen
}

// TextBytes is Text of a byte slice, without copying it.
func TextBytes(b []byte) int64 { return textRaw(b) }

// Ceiling reads a stated token limit: a JSON integer, a float (32000.0) or a numeric
// string ("32000"). Anything else, or a negative value, is no limit (0). A value too
// large to hold saturates at MaxTokens.
func Ceiling(raw []byte) int64 {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	s := string(raw)
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !math.IsInf(f, 1) {
		return 0
	}
	if f <= 0 || math.IsNaN(f) {
		return 0
	}
	if f >= float64(MaxTokens) {
		return MaxTokens
	}
	return int64(math.Ceil(f))
}

// Model reads only the model name of a JSON body (its last "model" key, as the
// upstream reads it), for routing a request that is not charged.
func Model(body []byte) string {
	e, _ := scanBody(body, false)
	return e.Model
}

// satAdd adds two non-negative counts, saturating at MaxTokens.
func satAdd(a, b int64) int64 {
	if a >= MaxTokens-b {
		return MaxTokens
	}
	return a + b
}

// satMul multiplies two non-negative counts, saturating at MaxTokens.
func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a >= MaxTokens/b {
		return MaxTokens
	}
	return a * b
}
