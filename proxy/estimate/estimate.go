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

// request is the part of a request body the estimate reads. Every field stays raw so
// that one pass of the decoder serves every API shape.
type request struct {
	Model               json.RawMessage   `json:"model"`
	Messages            []json.RawMessage `json:"messages"`
	Tools               json.RawMessage   `json:"tools"`
	Functions           json.RawMessage   `json:"functions"`
	ResponseFormat      json.RawMessage   `json:"response_format"`
	Prompt              json.RawMessage   `json:"prompt"`
	Input               json.RawMessage   `json:"input"`
	Instructions        json.RawMessage   `json:"instructions"`
	System              json.RawMessage   `json:"system"`
	Text                json.RawMessage   `json:"text"` // Responses: text.format is its response_format
	MaxTokens           json.RawMessage   `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage   `json:"max_completion_tokens"`
	MaxOutputTokens     json.RawMessage   `json:"max_output_tokens"`
	N                   json.RawMessage   `json:"n"`
	Stream              json.RawMessage   `json:"stream"`
}

// Body estimates a request body. A body that is not a JSON object gets the
// conservative fallback: one token per three bytes plus the default output ceiling.
func Body(body []byte) Estimate {
	var r request
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &r) != nil {
		return Estimate{Input: int64(len(body)+2) / 3, Output: DefaultOutput}
	}
	e := Estimate{Parsed: true}
	_ = json.Unmarshal(r.Model, &e.Model)
	_ = json.Unmarshal(r.Stream, &e.Stream)

	var in int64
	for _, m := range r.Messages {
		in += MessageFloor + Value(m)
	}
	// Tools, functions and output schemas are sent to the model as text: their whole
	// JSON counts.
	in += Text(string(r.Tools)) + Text(string(r.Functions)) + Text(string(r.ResponseFormat)) + Text(string(r.Text))
	// The prompt fields the message walk does not see: completions' prompt, Responses'
	// input and instructions, Anthropic's system.
	in += Value(r.Prompt) + Items(r.Input) + Value(r.Instructions) + Value(r.System)
	e.Input = in

	out := max(Ceiling(r.MaxTokens), Ceiling(r.MaxCompletionTokens), Ceiling(r.MaxOutputTokens))
	if out <= 0 {
		out = DefaultOutput
	}
	if n := Ceiling(r.N); n > 1 {
		out *= min(n, maxN)
	}
	e.Output = out
	return e
}

// Items estimates a Responses input: a string, or a list of items that are messages
// (each with the message floor) or other parts.
func Items(raw json.RawMessage) int64 {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		return Value(raw)
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return Text(string(raw))
	}
	var n int64
	for _, it := range items {
		n += MessageFloor + Value(it)
	}
	return n
}

// Value estimates any JSON value: the text of every string in it, one token per
// integer in an array of token ids, and MediaTokens for each binary payload (a string
// under "data", "file_data" or "b64_json", or a data: URL).
func Value(raw json.RawMessage) int64 {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var (
		n       int64
		lastKey string
		// inObject tracks, per nesting level, whether the next string is a key.
		stack []bool // true: object
		isKey bool
	)
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, true)
				isKey = true
			case '[':
				stack = append(stack, false)
				isKey = false
			default:
				stack = stack[:len(stack)-1]
				isKey = len(stack) > 0 && stack[len(stack)-1]
			}
			continue
		case string:
			if isKey {
				lastKey = t
				isKey = false
				continue
			}
			if isMedia(lastKey, t) {
				n += MediaTokens
			} else {
				n += Text(t)
			}
		case json.Number:
			// Token ids in a prompt array, or numbers in a part: one token each.
			n++
		}
		// After a value inside an object the next string is a key again.
		isKey = len(stack) > 0 && stack[len(stack)-1]
	}
	return n
}

func isMedia(key, s string) bool {
	switch key {
	case "data", "file_data", "b64_json", "image_url", "url":
		return len(s) > 5 && (s[:5] == "data:" || key == "data" || key == "file_data" || key == "b64_json")
	}
	return len(s) > 5 && s[:5] == "data:"
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
func Ceiling(raw json.RawMessage) int64 {
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
