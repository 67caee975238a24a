// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package usage

import (
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

// The scanner reads one JSON value pushed to it in pieces of any size, with memory
// bounded whatever the value's size: it keeps the open containers (one bit each, up to
// encoding/json's nesting limit), the key being read when its container is on a path
// of interest, and the few results below. It finds the usage objects and the generated
// text on the paths a tree of nodes names, and reports whether the value was valid
// JSON, with the same verdict as encoding/json.Valid.

// action is what the scanner does with a value on a known path.
type action uint8

const (
	_ action = iota // nothing to do
	// actText: a string here is generated text.
	actText
	// actAllText: every string beneath, keys included, is generated text (a tool
	// call's input object).
	actAllText
	// actDelta: a string here is a Responses event's delta, generated text unless the
	// event carries audio.
	actDelta
	// actType: the event's type.
	actType
	// actUsage: an object of usage counts.
	actUsage
	// actStartUsage: Anthropic's message_start usage, whose output count is
	// provisional.
	actStartUsage
	// actField: one count of a usage object; node.field says which.
	actField
)

// node is a path the scanner knows: the action for a value there, and the nodes of its
// members (an object's keys, an array's elements).
type node struct {
	keys  map[string]*node
	elem  *node
	act   action
	field uint8
}

// The counts a usage object may carry.
const (
	fPrompt = iota
	fCompletion
	fInput
	fOutput
	fCacheCreation
	fCacheRead
	// fDetailsCached is OpenAI's prompt_tokens_details.cached_tokens and the Responses
	// API's input_tokens_details.cached_tokens: the part of the input count read
	// from the prompt cache.
	fDetailsCached
	numFields
)

func usageNode(act action) *node {
	field := func(f uint8) *node { return &node{act: actField, field: f} }
	return &node{act: act, keys: map[string]*node{
		"prompt_tokens":               field(fPrompt),
		"completion_tokens":           field(fCompletion),
		"input_tokens":                field(fInput),
		"output_tokens":               field(fOutput),
		"cache_creation_input_tokens": field(fCacheCreation),
		"cache_read_input_tokens":     field(fCacheRead),
		"prompt_tokens_details":       obj(map[string]*node{"cached_tokens": field(fDetailsCached)}),
		"input_tokens_details":        obj(map[string]*node{"cached_tokens": field(fDetailsCached)}),
	}}
}

func obj(keys map[string]*node) *node { return &node{keys: keys} }
func arr(elem *node) *node            { return &node{elem: elem} }

var (
	text    = &node{act: actText}
	allText = &node{act: actAllText}
)

// textNode is a string of text, or an array of parts that carry text.
func textNode() *node {
	return &node{act: actText, elem: obj(map[string]*node{"text": text})}
}

// toolCalls is OpenAI's tool_calls: the arguments the model wrote.
func toolCalls() *node {
	return arr(obj(map[string]*node{"function": obj(map[string]*node{"arguments": text})}))
}

// bodyTree names what a non-streamed response carries: its usage, and the generated
// text of the three families for a response that reports none.
var bodyTree = obj(map[string]*node{
	"usage":    usageNode(actUsage),
	"response": obj(map[string]*node{"usage": usageNode(actUsage)}),
	// OpenAI chat and completions.
	"choices": arr(obj(map[string]*node{
		"text": text,
		"message": obj(map[string]*node{
			"content":           textNode(),
			"reasoning_content": text,
			"reasoning":         text,
			"refusal":           text,
			"tool_calls":        toolCalls(),
		}),
	})),
	// Anthropic messages.
	"content": arr(obj(map[string]*node{"text": text, "thinking": text, "input": allText})),
	// The Responses API.
	"output": arr(obj(map[string]*node{
		"content":   arr(obj(map[string]*node{"text": text, "refusal": text})),
		"summary":   arr(obj(map[string]*node{"text": text})),
		"arguments": text,
		"input":     allText,
	})),
})

// streamTree names what one server-sent event carries: its type, its usage, and its
// delta of generated text.
var streamTree = obj(map[string]*node{
	"type":     {act: actType},
	"usage":    usageNode(actUsage),
	"message":  obj(map[string]*node{"usage": usageNode(actStartUsage)}),
	"response": obj(map[string]*node{"usage": usageNode(actUsage)}),
	// OpenAI chat and completions chunks.
	"choices": arr(obj(map[string]*node{
		"text": text,
		"delta": obj(map[string]*node{
			"content":           textNode(),
			"reasoning_content": text,
			"reasoning":         text,
			"refusal":           text,
			"tool_calls":        toolCalls(),
		}),
	})),
	// A string in the Responses API; an object in Anthropic's content_block_delta.
	"delta": {act: actDelta, keys: map[string]*node{"text": text, "partial_json": text, "thinking": text}},
})

const (
	// maxDepth is encoding/json's nesting limit: a deeper value is invalid.
	maxDepth = 10000
	// maxPath is deeper than any path the trees name.
	maxPath = 8
	// maxKey bounds a key compared with the tree's; a longer one names nothing.
	maxKey = 32
	// maxType bounds an event type.
	maxType = 64
	// maxNumber bounds a usage count's spelling.
	maxNumber = 32
	// maxReports bounds the usage objects one value reports.
	maxReports = 4
	// textChunk is how much decoded text is gathered before it is counted: text is
	// counted in chunks of this size, which rounds up at most one token per chunk.
	textChunk = 512
)

// Scanner states.
const (
	stValue    uint8 = iota // before a value
	stArrFirst              // after '[': a value or ']'
	stObjFirst              // after '{': a key or '}'
	stObjKey                // after ',' in an object: a key
	stColon                 // after a key
	stAfter                 // after a value in a container: ',' or the container's end
	stDone                  // after the top-level value: only whitespace
	stString                // in a string
	stEsc                   // after a backslash in a string
	stHex                   // in the four digits of \u
	stNumber                // in a number; num says where
	stWord                  // in true, false or null
)

// Number states: the JSON number grammar.
const (
	nMinus uint8 = iota // after '-'
	nZero               // after a leading 0
	nInt                // in the integer digits
	nDot                // after '.'
	nFrac               // in the fraction digits
	nE                  // after 'e'
	nESign              // after the exponent's sign
	nExp                // in the exponent digits
)

// Where a string's decoded bytes go.
const (
	sinkNone uint8 = iota
	sinkKey
	sinkType
	sinkText
	sinkDelta
)

// Text classes.
const (
	clsText = iota
	clsDelta
	numClasses
)

// report is one usage object: the counts it carries.
type report struct {
	v   [numFields]int64
	has uint8
	// start is message_start's report.
	start bool
}

type scanner struct {
	root  *node
	state uint8
	// depth is the number of open containers; kinds has one bit per open container,
	// set for an object (kindsX beyond 128 levels).
	depth  int
	kinds  [2]uint64
	kindsX []uint64
	// nodes[d] is the node of the open container at depth d (nil: nothing known).
	nodes [maxPath + 1]*node
	// cur is the node of the value about to be read.
	cur *node
	// allText and usageDepth are the depths of the open actAllText container and
	// usage object, 0 when none.
	allText, usageDepth int
	// started: a value began; done: the top-level value is complete; bad: the input
	// is not one valid JSON value.
	started, done, bad bool

	// The string being read.
	key    bool
	sink   uint8
	hex    rune
	hexN   uint8
	hi     rune // a high surrogate waiting for its pair
	keyBuf [maxKey]byte
	keyN   int // maxKey+1: too long
	typ    [maxType]byte
	typN   int // maxType+1: too long

	// The number or word being read.
	num   uint8
	word  string
	wordI int
	field int // the usage count the number is, or -1
	numB  [maxNumber]byte
	numN  int // maxNumber+1: too long

	// Results.
	rep      report
	reports  [maxReports]report
	nreports int
	tokens   [numClasses]int64
	any      [numClasses]bool
	buf      [textChunk]byte
	bufN     int
	bufCls   uint8
}

// reset prepares the scanner for a new value on root.
func (s *scanner) reset(root *node) {
	x := s.kindsX[:0]
	*s = scanner{root: root, kindsX: x}
	s.cur = root
	s.field = -1
}

func (s *scanner) isObject(d int) bool {
	d--
	if d < 128 {
		return s.kinds[d/64]&(1<<(d%64)) != 0
	}
	d -= 128
	return s.kindsX[d/64]&(1<<(d%64)) != 0
}

func (s *scanner) setKind(d int, object bool) {
	d--
	var w *uint64
	bit := uint64(1) << (d % 64)
	if d < 128 {
		w = &s.kinds[d/64]
	} else {
		d -= 128
		for len(s.kindsX) <= d/64 {
			s.kindsX = append(s.kindsX, 0)
		}
		w = &s.kindsX[d/64]
	}
	if object {
		*w |= bit
	} else {
		*w &^= bit
	}
}

// top is the node of the innermost open container.
func (s *scanner) top() *node {
	if s.depth > maxPath {
		return nil
	}
	return s.nodes[s.depth]
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// write feeds the next bytes of the value.
func (s *scanner) write(p []byte) {
	for i := 0; i < len(p) && !s.bad; {
		switch s.state {
		case stString:
			i = s.stringRun(p, i)
			continue
		case stNumber:
			if s.number(p[i]) {
				i++
			}
			continue
		}
		c := p[i]
		i++
		switch s.state {
		case stValue:
			if !isSpace(c) {
				s.value(c)
			}
		case stArrFirst:
			if c == ']' {
				s.close()
			} else if !isSpace(c) {
				s.value(c)
			}
		case stObjFirst, stObjKey:
			switch {
			case isSpace(c):
			case c == '"':
				s.startKey()
			case c == '}' && s.state == stObjFirst:
				s.close()
			default:
				s.bad = true
			}
		case stColon:
			switch {
			case isSpace(c):
			case c == ':':
				s.state = stValue
			default:
				s.bad = true
			}
		case stAfter:
			object := s.isObject(s.depth)
			switch {
			case isSpace(c):
			case c == ',':
				if object {
					s.state = stObjKey
				} else {
					s.state, s.cur = stValue, elem(s.top())
				}
			case c == '}' && object, c == ']' && !object:
				s.close()
			default:
				s.bad = true
			}
		case stDone:
			if !isSpace(c) {
				s.bad = true
			}
		case stEsc:
			s.escape(c)
		case stHex:
			s.hexDigit(c)
		case stWord:
			if c != s.word[s.wordI] {
				s.bad = true
				break
			}
			if s.wordI++; s.wordI == len(s.word) {
				s.valueDone()
			}
		}
	}
}

func elem(n *node) *node {
	if n == nil {
		return nil
	}
	return n.elem
}

// value starts the value whose first byte is c.
func (s *scanner) value(c byte) {
	s.started = true
	switch c {
	case '{':
		s.open(true)
	case '[':
		s.open(false)
	case '"':
		s.startString()
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		s.state, s.numN, s.field = stNumber, 0, -1
		if n := s.cur; n != nil && n.act == actField && s.usageDepth > 0 {
			s.field = int(n.field)
		}
		switch c {
		case '-':
			s.num = nMinus
		case '0':
			s.num = nZero
		default:
			s.num = nInt
		}
		s.numByte(c)
	case 't':
		s.state, s.word, s.wordI = stWord, "true", 1
	case 'f':
		s.state, s.word, s.wordI = stWord, "false", 1
	case 'n':
		s.state, s.word, s.wordI = stWord, "null", 1
	default:
		s.bad = true
	}
}

func (s *scanner) valueDone() {
	if s.depth == 0 {
		s.state, s.done = stDone, true
	} else {
		s.state = stAfter
	}
}

func (s *scanner) open(object bool) {
	if s.depth >= maxDepth {
		s.bad = true
		return
	}
	s.depth++
	s.setKind(s.depth, object)
	n := s.cur
	if s.depth > maxPath {
		n = nil
	} else {
		s.nodes[s.depth] = n
	}
	if n != nil {
		switch n.act {
		case actUsage, actStartUsage:
			if object && s.usageDepth == 0 {
				s.usageDepth = s.depth
				s.rep = report{start: n.act == actStartUsage}
			}
		case actAllText:
			if s.allText == 0 {
				s.allText = s.depth
			}
		}
	}
	if object {
		s.state = stObjFirst
	} else {
		s.state, s.cur = stArrFirst, elem(n)
	}
}

func (s *scanner) close() {
	if s.depth == s.usageDepth {
		if s.rep.has != 0 && s.nreports < maxReports {
			s.reports[s.nreports] = s.rep
			s.nreports++
		}
		s.usageDepth = 0
	}
	if s.depth == s.allText {
		s.allText = 0
	}
	s.depth--
	s.valueDone()
}

func (s *scanner) startKey() {
	s.state, s.key, s.hi, s.keyN = stString, true, 0, 0
	switch n := s.top(); {
	case s.allText > 0:
		s.sink = sinkText
	case n != nil && n.keys != nil:
		s.sink = sinkKey
	default:
		s.sink = sinkNone
	}
}

func (s *scanner) startString() {
	s.state, s.key, s.hi = stString, false, 0
	s.sink = sinkNone
	if s.allText > 0 {
		s.sink = sinkText
		return
	}
	if n := s.cur; n != nil {
		switch n.act {
		case actText, actAllText:
			s.sink = sinkText
		case actDelta:
			s.sink = sinkDelta
		case actType:
			if s.depth == 1 {
				s.sink, s.typN = sinkType, 0
			}
		}
	}
}

// stringRun reads string bytes from p[i:] up to the next quote, backslash or control
// byte, and that byte; it returns where it stopped.
func (s *scanner) stringRun(p []byte, i int) int {
	start := i
	for i < len(p) {
		if c := p[i]; c == '"' || c == '\\' || c < 0x20 {
			break
		}
		i++
	}
	if i > start && s.sink != sinkNone {
		s.flushHi()
		s.emit(p[start:i])
	}
	if i == len(p) {
		return i
	}
	switch p[i] {
	case '"':
		s.flushHi()
		s.endString()
	case '\\':
		s.state = stEsc
	default:
		s.bad = true // a control byte in a string
	}
	return i + 1
}

func (s *scanner) endString() {
	if s.key {
		s.state, s.cur = stColon, nil
		if s.sink == sinkKey && s.keyN <= maxKey {
			if n := s.top(); n != nil {
				s.cur = n.keys[string(s.keyBuf[:s.keyN])]
			}
		}
		return
	}
	s.valueDone()
}

func (s *scanner) escape(c byte) {
	var b byte
	switch c {
	case '"', '\\', '/':
		b = c
	case 'b':
		b = '\b'
	case 'f':
		b = '\f'
	case 'n':
		b = '\n'
	case 'r':
		b = '\r'
	case 't':
		b = '\t'
	case 'u':
		s.state, s.hex, s.hexN = stHex, 0, 0
		return
	default:
		s.bad = true
		return
	}
	s.state = stString
	if s.sink != sinkNone {
		s.flushHi()
		s.emit([]byte{b})
	}
}

func (s *scanner) hexDigit(c byte) {
	var v rune
	switch {
	case c >= '0' && c <= '9':
		v = rune(c - '0')
	case c >= 'a' && c <= 'f':
		v = rune(c-'a') + 10
	case c >= 'A' && c <= 'F':
		v = rune(c-'A') + 10
	default:
		s.bad = true
		return
	}
	s.hex = s.hex<<4 | v
	if s.hexN++; s.hexN < 4 {
		return
	}
	s.state = stString
	if s.sink == sinkNone {
		return
	}
	r := s.hex
	switch {
	case s.hi != 0 && r >= 0xDC00 && r < 0xE000:
		r = 0x10000 + (s.hi-0xD800)<<10 + (r - 0xDC00)
		s.hi = 0
	case r >= 0xD800 && r < 0xDC00:
		s.flushHi()
		s.hi = r
		return
	default:
		s.flushHi()
	}
	s.emitRune(r)
}

// flushHi emits a high surrogate that found no pair, as encoding/json does: U+FFFD.
func (s *scanner) flushHi() {
	if s.hi != 0 {
		s.hi = 0
		s.emitRune(utf8.RuneError)
	}
}

func (s *scanner) emitRune(r rune) {
	var b [utf8.UTFMax]byte
	s.emit(b[:utf8.EncodeRune(b[:], r)])
}

// emit passes decoded string bytes to the string's sink.
func (s *scanner) emit(b []byte) {
	switch s.sink {
	case sinkKey:
		s.keyN = appendBounded(s.keyBuf[:], s.keyN, b)
	case sinkType:
		s.typN = appendBounded(s.typ[:], s.typN, b)
	case sinkText:
		s.addText(clsText, b)
	case sinkDelta:
		s.addText(clsDelta, b)
	}
}

// appendBounded appends b to dst[:n]; a result longer than dst is marked len(dst)+1.
func appendBounded(dst []byte, n int, b []byte) int {
	if n+len(b) > len(dst) {
		return len(dst) + 1
	}
	return n + copy(dst[n:], b)
}

func (s *scanner) addText(cls uint8, b []byte) {
	if len(b) == 0 {
		return
	}
	if s.bufN > 0 && s.bufCls != cls {
		s.flushText()
	}
	s.bufCls, s.any[cls] = cls, true
	for len(b) > 0 {
		n := copy(s.buf[s.bufN:], b)
		s.bufN += n
		b = b[n:]
		if s.bufN == len(s.buf) {
			// Count the full chunk up to its last whole character.
			cut := s.bufN
			for k := 1; k <= utf8.UTFMax-1 && k <= cut; k++ {
				if c := s.buf[cut-k]; utf8.RuneStart(c) {
					if !utf8.FullRune(s.buf[cut-k : cut]) {
						cut -= k
					}
					break
				}
			}
			s.tokens[cls] += countText(s.buf[:cut])
			s.bufN = copy(s.buf[:], s.buf[cut:s.bufN])
		}
	}
}

// flushText counts the gathered text.
func (s *scanner) flushText() {
	if s.bufN > 0 {
		s.tokens[s.bufCls] += countText(s.buf[:s.bufN])
		s.bufN = 0
	}
}

// countText is estimate.Text on bytes, without copying them.
func countText(b []byte) int64 { return estimate.TextBytes(b) }

// number reads c in a number; it reports false when c is not part of the number (the
// number ended before it, and c is read in the next state).
func (s *scanner) number(c byte) bool {
	digit := c >= '0' && c <= '9'
	switch s.num {
	case nMinus:
		switch {
		case c == '0':
			s.num = nZero
		case digit:
			s.num = nInt
		default:
			s.bad = true
			return true
		}
	case nZero, nInt:
		switch {
		case digit && s.num == nInt:
		case c == '.':
			s.num = nDot
		case c == 'e' || c == 'E':
			s.num = nE
		default:
			s.endNumber()
			return false
		}
	case nDot:
		if !digit {
			s.bad = true
			return true
		}
		s.num = nFrac
	case nFrac, nExp:
		switch {
		case digit:
		case (c == 'e' || c == 'E') && s.num == nFrac:
			s.num = nE
		default:
			s.endNumber()
			return false
		}
	case nE:
		switch {
		case c == '+' || c == '-':
			s.num = nESign
		case digit:
			s.num = nExp
		default:
			s.bad = true
			return true
		}
	case nESign:
		if !digit {
			s.bad = true
			return true
		}
		s.num = nExp
	}
	s.numByte(c)
	return true
}

func (s *scanner) numByte(c byte) {
	if s.field >= 0 {
		s.numN = appendBounded(s.numB[:], s.numN, []byte{c})
	}
}

// endNumber completes a number; a usage count is recorded, saturated and never
// negative.
func (s *scanner) endNumber() {
	if s.field >= 0 {
		var v int64
		switch {
		case s.numN > maxNumber:
			if s.numB[0] != '-' {
				v = math.MaxInt64 / 4
			}
		default:
			f, _ := strconv.ParseFloat(string(s.numB[:s.numN]), 64)
			switch {
			case f >= math.MaxInt64/4:
				v = math.MaxInt64 / 4
			case f > 0:
				v = int64(math.Ceil(f))
			}
		}
		s.rep.v[s.field] = v
		s.rep.has |= 1 << s.field
	}
	s.valueDone()
}

// finish ends the input: it completes a top-level number and reports whether the
// input was one whole valid JSON value.
func (s *scanner) finish() bool {
	if s.state == stNumber && s.depth == 0 && !s.bad {
		switch s.num {
		case nZero, nInt, nFrac, nExp:
			s.endNumber()
		}
	}
	s.flushText()
	return s.done && !s.bad
}

// typeIs reports whether the value's top-level type is t.
func (s *scanner) typeIs(t string) bool {
	return s.typN <= maxType && string(s.typ[:s.typN]) == t
}

// merge applies a report onto u; absent counts keep their value, so Anthropic's
// message_delta (cumulative output, sometimes input) updates message_start. cache
// holds Anthropic's cache creation and cache read counts (which its input_tokens does
// not include) and the cached count of OpenAI's and the Responses API's details
// (which their input count includes).
func (r *report) merge(u *Usage, cache *[3]int64, input *int64) {
	has := func(f int) bool { return r.has&(1<<f) != 0 }
	if has(fPrompt) {
		*input, cache[0], cache[1], cache[2] = r.v[fPrompt], 0, 0, 0
	}
	if has(fInput) {
		*input = r.v[fInput]
	}
	if has(fCacheCreation) {
		cache[0] = r.v[fCacheCreation]
	}
	if has(fCacheRead) {
		cache[1] = r.v[fCacheRead]
	}
	if has(fDetailsCached) {
		cache[2] = r.v[fDetailsCached]
	}
	if has(fCompletion) {
		u.Output = r.v[fCompletion]
	}
	if has(fOutput) {
		u.Output = r.v[fOutput]
	}
	if r.has != 0 {
		u.Found = true
		u.Input = *input + cache[0] + cache[1]
		// Cached counts saturate like every count (at MaxInt64/4), so the sum holds.
		u.Cached = min(cache[1]+cache[2], u.Input)
	}
}
