// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate

import (
	"bytes"
	"encoding/json"
	"math"
)

// What the scan keeps of a body for the stages after it, so that none reads the JSON
// again: the spans of its model (the provider-model rename), what it says of the
// state a Responses call keeps upstream (the response cache), and, when asked for,
// every value it holds (View: a tokenizer's count).

// Span is where a value's bytes are in the body: body[Start:End].
type Span struct{ Start, End int }

// Flag is a boolean field of a body as encoding/json decodes it into a *bool: absent
// (or null), false or true.
type Flag uint8

// The values of a Flag.
const (
	Unset Flag = iota
	False
	True
)

// State is what a body says of the state a Responses call keeps upstream, read as
// encoding/json reads those fields into a struct: a key matches its field ignoring
// case, and the last occurrence wins.
type State struct {
	// Store and Background are the store and background fields.
	Store, Background Flag
	// PreviousResponse and Conversation: previous_response_id and conversation are set
	// to something other than null.
	PreviousResponse, Conversation bool
	// Invalid: store or background is given as something other than a boolean or
	// null, which encoding/json refuses.
	Invalid bool
}

// read takes a top-level member into State: its decoded key and its raw value.
func (st *State) read(key, raw []byte) {
	set := string(raw) != "null"
	switch {
	case bytes.EqualFold(key, []byte("store")):
		st.Store = flagOf(raw, &st.Invalid)
	case bytes.EqualFold(key, []byte("background")):
		st.Background = flagOf(raw, &st.Invalid)
	case bytes.EqualFold(key, []byte("previous_response_id")):
		st.PreviousResponse = set
	case bytes.EqualFold(key, []byte("conversation")):
		st.Conversation = set
	}
}

// flagOf is a boolean value; anything else but null sets invalid.
func flagOf(raw []byte, invalid *bool) Flag {
	switch string(raw) {
	case "true":
		return True
	case "false":
		return False
	case "null":
		return Unset
	}
	*invalid = true
	return Unset
}

// mayBeStateKey is a cheap test that a key may fold to one of State's fields.
func mayBeStateKey(key []byte) bool {
	if len(key) < 5 {
		return false
	}
	switch key[0] | 0x20 {
	case 's', 'b', 'p', 'c':
		return true
	}
	return key[0] >= 0x80
}

// Renamed is the body the estimate was made of with its model set to name: the value
// of every top-level "model" key replaced, or, when it has none, "model" added as its
// first member. ok is false when the body is not a JSON object.
func (e *Estimate) Renamed(body []byte, name string) (out []byte, ok bool) {
	if !e.Parsed {
		return nil, false
	}
	lit, err := json.Marshal(name)
	if err != nil {
		return nil, false // unreachable: a string always encodes
	}
	one := [1]Span{e.model}
	spans := one[:min(e.models, 1)]
	if e.models > 1 {
		spans = e.spill.models
	}
	if len(spans) == 0 {
		member := append(append([]byte(`"model":`), lit...), ',')
		if e.empty {
			member = member[:len(member)-1]
		}
		out = make([]byte, 0, len(body)+len(member))
		open := openingBrace(body) + 1
		out = append(append(append(out, body[:open]...), member...), body[open:]...)
		return out, true
	}
	out = make([]byte, 0, len(body)+len(spans)*len(lit))
	at := 0
	for _, s := range spans {
		out = append(append(out, body[at:s.Start]...), lit...)
		at = s.End
	}
	return append(out, body[at:]...), true
}

// addModel records a top-level model value's span.
func (e *Estimate) addModel(s Span) {
	switch e.models {
	case 0:
		e.model = s
		e.models = 1
	case 1:
		sp := e.own()
		sp.models = append(sp.models, e.model, s)
		e.models = 2
	default:
		e.spill.models = append(e.spill.models, s)
	}
}

// openingBrace is where a JSON object's opening brace is: after its leading whitespace.
func openingBrace(body []byte) int {
	s := &scanner{b: body}
	s.ws()
	return s.i
}

// shift moves the spans at or after at by delta bytes: the body was rewritten before them.
func (e *Estimate) shift(at, delta int) {
	move := func(s *Span) {
		if s.Start >= at {
			s.Start += delta
			s.End += delta
		}
	}
	switch e.models {
	case 0:
		return
	case 1:
		move(&e.model)
		return
	}
	sp := e.own() // a copy's spans are its own
	for i := range sp.models {
		move(&sp.models[i])
	}
}

// Kind is what a value of a View is.
type Kind uint8

// The kinds of a View's values.
const (
	KindObject Kind = iota + 1
	KindArray
	KindString
	KindNumber
	KindLiteral // true, false or null
	KindKey     // an object's key; its value follows it
)

// node is one value of a View: its bytes (a string's with its quotes) and the index of
// the node after it and everything it holds.
type node struct {
	start, end, next int32
	kind             Kind
}

// View is every value of a body as the scan found it, in the order written: a
// container is followed by what it holds (each object member as its key, then its
// value), and Next skips past it. Index 0 is the top-level object.
type View struct {
	body  []byte
	nodes []node
}

// Len is the number of values.
func (v *View) Len() int { return len(v.nodes) }

// Kind is the kind of value i.
func (v *View) Kind(i int) Kind { return v.nodes[i].kind }

// Next is the index after value i and everything it holds.
func (v *View) Next(i int) int { return int(v.nodes[i].next) }

// Raw is value i as written: a string with its quotes and escapes.
func (v *View) Raw(i int) []byte { n := v.nodes[i]; return v.body[n.start:n.end] }

// Span is where value i is in the body.
func (v *View) Span(i int) Span { n := v.nodes[i]; return Span{int(n.start), int(n.end)} }

// String is string or key i as encoding/json decodes it, escapes resolved and invalid
// UTF-8 replaced; decoded is false when that is the raw content (body[Span.Start+1:
// Span.End-1]), so a caller holding the body as a string can slice it instead.
func (v *View) String(i int) (s string, decoded bool) {
	raw := v.Raw(i)
	raw = raw[1 : len(raw)-1]
	if !needsDecoding(raw) {
		return "", false
	}
	return decodeString(raw), true
}

// Body is the body the view was made of.
func (v *View) Body() []byte { return v.body }

// viewable reports whether a view of body fits its offsets.
func viewable(body []byte) bool { return len(body) < math.MaxInt32 }

// add appends a value at body[start:end] and returns its index; a container is
// ended by close.
func (v *View) add(k Kind, start, end int) int32 {
	i := int32(len(v.nodes))
	v.nodes = append(v.nodes, node{start: int32(start), end: int32(end), next: i + 1, kind: k})
	return i
}

// close ends container i at end: everything since it is inside it.
func (v *View) close(i int32, end int) {
	v.nodes[i].end = int32(end)
	v.nodes[i].next = int32(len(v.nodes))
}
