// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package estimate computes a request's token reservation without a tokenizer: an
// input estimate that walks every part of the prompt, plus the output ceiling the
// request states. docs/estimation.md gives the formula; it over-counts by construction
// and settlement refunds the difference.
package estimate

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

const (
	// DefaultOutput is the output ceiling of a request that states none.
	DefaultOutput = 4096
	// MessageFloor is the framing each message costs beyond its text (role, separators).
	MessageFloor = 4
	// MediaTokens is the charge for one non-text part (an image, audio or file payload):
	// its bytes are not text, so they are not counted as text.
	MediaTokens = 1600
	// maxN bounds the number of choices that multiply the output ceiling.
	maxN = 128
)

// Estimate is a request's reservation and the facts admission needs from its body.
type Estimate struct {
	// Input is the estimated input tokens.
	Input int64
	// Output is the output ceiling: the largest stated limit times the number of
	// choices, or DefaultOutput.
	Output int64
	// Model is the request's model name; empty when absent.
	Model string
	// Stream is true when the request asks for a streamed response.
	Stream bool
	// Parsed is false when the body is not a JSON object; the estimate is then the
	// conservative fallback.
	Parsed bool
}

// Total is the reservation: input estimate plus output ceiling, with no margin.
func (e Estimate) Total() int64 { return e.Input + e.Output }

// Body estimates a request body in one pass. A body that is not a JSON object gets
// the conservative fallback: one token per three bytes plus the default output ceiling.
func Body(body []byte) Estimate {
	e, err := scanBody(body)
	if err != nil {
		return Estimate{Input: int64(len(body)+2) / 3, Output: DefaultOutput}
	}
	return e
}

func scanBody(body []byte) (Estimate, error) {
	s := &scanner{b: body}
	e := Estimate{Parsed: true}
	var in, out, n int64
	err := s.object(func(key []byte) error {
		var v int64
		var err error
		switch string(key) {
		case "messages":
			// Every message with its floor.
			v, err = s.items()
		case "input":
			// Responses: a string, or a list of items that are messages or parts.
			v, err = s.items()
		case "prompt", "instructions", "system":
			// The prompt fields the message walk does not see.
			v, err = s.count(key)
		case "tools", "functions", "response_format", "text":
			// Sent to the model as text: the whole JSON counts (text.format is
			// Responses' response_format).
			var raw []byte
			raw, err = s.span()
			v = textRaw(raw)
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			var raw []byte
			raw, err = s.span()
			out = max(out, Ceiling(raw))
		case "n":
			var raw []byte
			raw, err = s.span()
			n = max(n, Ceiling(raw))
		case "model":
			if s.peek() == '"' {
				var raw []byte
				raw, err = s.str()
				e.Model = unquote(raw)
			} else {
				_, err = s.count(nil)
			}
		case "stream":
			var raw []byte
			raw, err = s.span()
			e.Stream = string(raw) == "true"
		default:
			_, err = s.count(nil)
		}
		in += v
		return err
	})
	if err != nil {
		return e, err
	}
	if s.ws(); s.i != len(s.b) {
		return e, errSyntax
	}
	if out <= 0 {
		out = DefaultOutput
	}
	if n > 1 {
		out *= min(n, maxN)
	}
	e.Input, e.Output = in, out
	return e, nil
}

// Text estimates a string: one token per four ASCII bytes (rounded up) and one token
// per non-ASCII character, which covers scripts whose characters are a token or more.
func Text(s string) int64 {
	var ascii, other int64
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			ascii++
			i++
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		other++
		i += size
	}
	return (ascii+3)/4 + other
}

// Ceiling reads a stated token limit: a JSON integer, a float (32000.0) or a numeric
// string ("32000"). Anything else, or a negative value, is no limit (0).
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
	if err != nil || f <= 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	if f >= math.MaxInt64/4 {
		return math.MaxInt64 / 4
	}
	return int64(math.Ceil(f))
}

// Model reads only the model name of a JSON body, for routing a request that is not
// charged.
func Model(body []byte) string {
	var r struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &r)
	return r.Model
}
