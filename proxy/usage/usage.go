// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package usage reads the token usage a backend reports: from a JSON response body,
// and from a server-sent-events stream as it passes through, without buffering it.
// It knows OpenAI chat and completions (usage.prompt_tokens, completion_tokens), the
// Responses API (response.completed's usage.input_tokens, output_tokens) and Anthropic
// messages (message_start usage plus message_delta usage, cache fields included).
package usage

import (
	"bytes"
	"encoding/json"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

// Usage is what a backend reported for one request.
type Usage struct {
	// Input counts every input token the backend read, cached ones included.
	Input int64
	// Output counts the generated tokens.
	Output int64
	// Found is true when the backend reported usage.
	Found bool
}

// Total is the tokens the request consumed.
func (u Usage) Total() int64 { return u.Input + u.Output }

// raw is the union of the usage objects of the three API families.
type raw struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	InputTokens      *int64 `json:"input_tokens"`
	OutputTokens     *int64 `json:"output_tokens"`
	// Anthropic reports cached input apart from input_tokens.
	CacheCreation *int64 `json:"cache_creation_input_tokens"`
	CacheRead     *int64 `json:"cache_read_input_tokens"`
}

// merge applies the fields a report carries onto u; absent fields keep their value, so
// Anthropic's message_delta (cumulative output, sometimes input) updates message_start.
func (r *raw) merge(u *Usage, cache *[2]int64, input *int64) {
	if r == nil {
		return
	}
	touched := false
	if r.PromptTokens != nil {
		*input, cache[0], cache[1] = *r.PromptTokens, 0, 0
		touched = true
	}
	if r.InputTokens != nil {
		*input = *r.InputTokens
		touched = true
	}
	if r.CacheCreation != nil {
		cache[0] = *r.CacheCreation
		touched = true
	}
	if r.CacheRead != nil {
		cache[1] = *r.CacheRead
		touched = true
	}
	if r.CompletionTokens != nil {
		u.Output = *r.CompletionTokens
		touched = true
	}
	if r.OutputTokens != nil {
		u.Output = *r.OutputTokens
		touched = true
	}
	if touched {
		u.Found = true
		u.Input = *input + cache[0] + cache[1]
	}
}

// FromJSON reads the usage of a non-streamed response body of any of the three
// families. Only the usage objects are decoded; the rest of the body is skipped.
func FromJSON(body []byte) Usage {
	var u Usage
	var cache [2]int64
	var input int64
	_ = estimate.Fields(body, func(key, value []byte) {
		switch string(key) {
		case "usage":
			var r *raw
			if json.Unmarshal(value, &r) == nil {
				r.merge(&u, &cache, &input)
			}
		case "response":
			var doc struct {
				Usage *raw `json:"usage"`
			}
			if json.Unmarshal(value, &doc) == nil {
				doc.Usage.merge(&u, &cache, &input)
			}
		}
	})
	return u
}

// maxLine bounds one SSE line kept for parsing; a longer line passes through unparsed.
const maxLine = 1 << 20

// Stream follows a server-sent-events response as it passes through Write. It never
// holds more than the current line.
type Stream struct {
	line     []byte
	overflow bool

	u     Usage
	cache [2]int64
	input int64
	// deltas estimates the generated text seen, for a backend that reports no usage.
	deltas int64
	// ended is true once the stream's own end marker arrived: data: [DONE] (OpenAI),
	// message_stop (Anthropic), response.completed or response.incomplete (Responses).
	ended bool
	// failed is true when the stream reported an error event.
	failed bool
}

// Write feeds bytes of the stream; it never fails.
func (s *Stream) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.appendLine(p)
			break
		}
		s.appendLine(p[:i])
		s.endLine()
		p = p[i+1:]
	}
	return n, nil
}

func (s *Stream) appendLine(p []byte) {
	if s.overflow {
		return
	}
	if len(s.line)+len(p) > maxLine {
		s.overflow = true
		s.line = s.line[:0]
		return
	}
	s.line = append(s.line, p...)
}

func (s *Stream) endLine() {
	line := bytes.TrimSuffix(s.line, []byte{'\r'})
	overflow := s.overflow
	s.line, s.overflow = s.line[:0], false
	if overflow {
		return
	}
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	s.event(bytes.TrimSpace(data))
}

// event is the union of the stream events the three families send.
type event struct {
	Type    string `json:"type"`
	Usage   *raw   `json:"usage"`
	Message *struct {
		Usage *raw `json:"usage"`
	} `json:"message"`
	Response *struct {
		Usage *raw `json:"usage"`
	} `json:"response"`
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Refusal          string `json:"refusal"`
			ToolCalls        []struct {
				Function struct {
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	// Delta is a string in the Responses API and an object in Anthropic's.
	Delta json.RawMessage `json:"delta"`
}

func (s *Stream) event(data []byte) {
	if len(data) == 0 {
		return
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		s.ended = true
		return
	}
	var ev event
	if json.Unmarshal(data, &ev) != nil {
		return
	}
	ev.Usage.merge(&s.u, &s.cache, &s.input)
	if ev.Message != nil {
		ev.Message.Usage.merge(&s.u, &s.cache, &s.input)
	}
	if ev.Response != nil {
		ev.Response.Usage.merge(&s.u, &s.cache, &s.input)
	}
	for _, c := range ev.Choices {
		text := c.Text + c.Delta.Content + c.Delta.ReasoningContent + c.Delta.Refusal
		for _, tc := range c.Delta.ToolCalls {
			text += tc.Function.Arguments
		}
		s.countDelta(text)
	}
	switch ev.Type {
	case "message_stop", "response.completed", "response.incomplete":
		s.ended = true
	case "error", "response.failed":
		s.failed = true
	case "response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta", "response.refusal.delta":
		var text string
		_ = json.Unmarshal(ev.Delta, &text)
		s.countDelta(text)
	case "content_block_delta":
		var d struct {
			Text        string `json:"text"`
			PartialJSON string `json:"partial_json"`
			Thinking    string `json:"thinking"`
		}
		_ = json.Unmarshal(ev.Delta, &d)
		s.countDelta(d.Text + d.PartialJSON + d.Thinking)
	}
}

// countDelta counts a chunk of generated text, at least one token per non-empty chunk.
func (s *Stream) countDelta(text string) {
	if text == "" {
		return
	}
	s.deltas += max(estimate.Text(text), 1)
}

// Ended reports whether the stream reached its own end marker without an error event.
func (s *Stream) Ended() bool { return s.ended && !s.failed }

// Usage is the usage the stream reported, if any.
func (s *Stream) Usage() Usage { return s.u }

// Final is what a normally ended stream settles on: the reported usage, or the input
// estimate plus the counted deltas when the backend reported none.
func (s *Stream) Final(inputEstimate int64) Usage {
	if s.u.Found {
		return s.u
	}
	return Usage{Input: inputEstimate, Output: s.deltas, Found: true}
}
