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
}

// Total is the reservation: input estimate plus output ceiling, with no margin.
func (e Estimate) Total() int64 { return satAdd(e.Input, e.Output) }

// Body estimates a request body in one pass. A body that is not a JSON object gets
// the conservative fallback: one token per three bytes plus the default output
// ceiling. A body nested deeper than MaxDepth is an error (ErrTooDeep): the caller
// refuses it, as upstreams do.
func Body(body []byte) (Estimate, error) {
	e, err := scanBody(body)
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

func scanBody(body []byte) (Estimate, error) {
	s := &scanner{b: body}
	e := Estimate{Parsed: true}
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
		if target != nil {
			*target = Ceiling(raw)
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
	out = satMul(satMul(out, prompts), max(n, bestOf, 1))
	e.Input, e.Output, e.InputLower = in, out, low
	return e, nil
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
	e, _ := scanBody(body)
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
