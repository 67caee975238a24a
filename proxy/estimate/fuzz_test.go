// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

// FuzzBody checks the estimator against encoding/json on any bytes: see checkBody.
func FuzzBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
		`{"prompt":[1,2,3],"n":2}`, `{"input":[{"type":"message"}]}`, `{}`, `[]`, `{"a":NaN}`,
		`{"a":"\ud800"}`, `{"a":1e5,"b":-0.5,"c":[true,false,null]}`, `{"a":"x"`, ` {"a":{}} `,
		`{"m\u0065ssages":[{"content":"abcdefgh"}],"max_\u0074okens":10,"mod\u0065l":"x"}`,
		`{"max_tokens":1e30,"max_tokens":4000,"n":5,"n":1}`, `{"max_tokens":1e400,"n":"7"}`,
		`{"prompt":["a",[1],"b"],"best_of":3}`, "{\"a\":\"\x80\x80\xff\"}",
		`{"source":{"type":"base64","media_type":"image/png","data":"QUJDRA=="}}`,
		`{"x":{"data":"QUJD","type":"base64","type":"text"}}`, `{"a":[[[[[[[[[[]]]]]]]]]]}`,
		`{"model":"a","messages":[{"model":"nested"}],"mod\u0065l":"b","model":"c"}`, ` { } `,
		`{"store":false,"STORE":true,"background":null}`, `{"\u017ftore":false,"previous_response_id":null}`,
		`{"store":false,"background":"yes","conversation":{"id":"c"}}`, `{"store":false,"Previous_Response_ID":"r"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkBody(t, body) })
}

// FuzzGenerated builds request bodies from the fuzzer's bytes, choosing among the
// shapes a hostile client would send (escaped and duplicated keys, huge numbers,
// deep nesting, media blocks, invalid UTF-8), and checks each with checkBody.
func FuzzGenerated(f *testing.F) {
	for _, s := range []string{"", "\x00\x01\x02", "\xff\xfe\xfd\xfc\xfb", "messages-max-n-model", strings.Repeat("\x07", 64)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, program []byte) {
		g := &generator{p: program}
		var b bytes.Buffer
		g.object(&b, 0)
		checkBody(t, b.Bytes())
	})
}

// checkBody is the estimator's contract, differential against encoding/json:
//   - a body is read as JSON exactly when encoding/json decodes it into a
//     map[string]any (numbers kept as written, so huge ones do not fail) and it is
//     nested at most estimate.MaxDepth deep; deeper is ErrTooDeep;
//   - the model, the stream flag and the output ceiling are those of the decoded map
//     (the last duplicate wins), the ceiling saturating at estimate.MaxTokens;
//   - the input estimate is never below the decoded strings, keys included, counted at
//     estimate.BytesPerToken bytes a token (media payloads excepted: they have their
//     own cost);
//   - nothing is negative and nothing passes MaxTokens.
func checkBody(t *testing.T, body []byte) {
	e, err := estimate.Body(body)
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	// encoding/json stops after the first value; the estimator wants nothing after it.
	ok := dec.Decode(&m) == nil && m != nil && strings.Trim(string(body[dec.InputOffset():]), " \t\r\n") == ""
	switch {
	case ok && rawDepth(body) > estimate.MaxDepth:
		// Depth is the body's, not the decoded map's: a deep value later replaced by a
		// duplicate key is still parsed, and refused, by the upstream.
		if !errors.Is(err, estimate.ErrTooDeep) {
			t.Fatalf("a body %d deep was not refused: %v %+v", rawDepth(body), err, e)
		}
		return
	case errors.Is(err, estimate.ErrTooDeep) && !ok && rawDepth(body) > estimate.MaxDepth:
		// Invalid and deep: refused at the depth before the scanner met the error.
		return
	case err != nil:
		t.Fatalf("error %v for a body encoding/json reads=%v: %q", err, ok, body)
	case e.Parsed != ok:
		t.Fatalf("Parsed=%v but encoding/json object=%v for %q", e.Parsed, ok, body)
	}
	if e.Input < 0 || e.Output <= 0 || e.Total() > estimate.MaxTokens || e.Output > estimate.MaxTokens {
		t.Fatalf("estimate %+v for %q", e, body)
	}
	if e.InputLower < 0 || e.InputLower > e.Input || e.OutputCap < 0 || e.OutputCap > e.Output {
		t.Fatalf("lower bound or cap out of the estimate: %+v for %q", e, body)
	}
	if !ok {
		return
	}
	model, _ := m["model"].(string)
	if e.Model != model {
		t.Fatalf("model %q, encoding/json reads %q, in %q", e.Model, model, body)
	}
	if want := m["stream"] == true; e.Stream != want {
		t.Fatalf("stream %v, encoding/json reads %v, in %q", e.Stream, want, body)
	}
	if want := outputOf(m); e.Output != want {
		t.Fatalf("output %d, the decoded body asks for %d, in %q", e.Output, want, body)
	}
	if honest := (decodedBytes(m, nil) + estimate.BytesPerToken - 1) / estimate.BytesPerToken; e.Input < honest {
		t.Fatalf("input %d is below the %d tokens of the decoded strings of %q", e.Input, honest, body)
	}
	checkRenamed(t, &e, body)
	if got, want := stateful(e.State), decodedStateful(body); got != want {
		t.Fatalf("stateful %v (%+v), encoding/json reads %v, in %q", got, e.State, want, body)
	}
}

// checkRenamed: the body renamed from the estimate's spans decodes as the body decoded
// by encoding/json with its model set, and the first "model" key also names it, for a
// decoder that keeps the first duplicate.
func checkRenamed(t *testing.T, e *estimate.Estimate, body []byte) {
	const name = "provider/<model> \"with\" é"
	out, ok := e.Renamed(body, name)
	if !ok {
		t.Fatalf("a JSON object %q was not renamed", body)
	}
	decode := func(b []byte) (m map[string]any, err error) {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		return m, d.Decode(&m)
	}
	want, err := decode(body)
	if err != nil {
		t.Fatal(err)
	}
	want["model"] = name
	got, err := decode(out)
	if err != nil {
		t.Fatalf("renamed %q into %q: %v", body, out, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("renamed %q into %q", body, out)
	}
	if first := firstModel(t, out); first != name {
		t.Fatalf("renamed %q into %q, whose first model is %q", body, out, first)
	}
}

// firstModel is the value of the first top-level key that decodes to "model".
func firstModel(t *testing.T, body []byte) string {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if _, err := d.Token(); err != nil {
		t.Fatal(err)
	}
	for d.More() {
		k, err := d.Token()
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		if k == "model" {
			s, _ := v.(string)
			return s
		}
	}
	t.Fatalf("no model in %q", body)
	return ""
}

// stateful is the response cache's reading of State.
func stateful(st estimate.State) bool {
	return st.Invalid || st.Store != estimate.False || st.PreviousResponse || st.Conversation || st.Background == estimate.True
}

// decodedStateful is the same question answered by encoding/json.
func decodedStateful(body []byte) bool {
	var b struct {
		Store              *bool           `json:"store"`
		PreviousResponseID json.RawMessage `json:"previous_response_id"`
		Conversation       json.RawMessage `json:"conversation"`
		Background         *bool           `json:"background"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return true
	}
	set := func(m json.RawMessage) bool { return len(m) > 0 && string(m) != "null" }
	return b.Store == nil || *b.Store || set(b.PreviousResponseID) || set(b.Conversation) ||
		(b.Background != nil && *b.Background)
}

// rawDepth is the deepest nesting of brackets outside strings.
func rawDepth(b []byte) int {
	d, deepest, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			d++
			deepest = max(deepest, d)
		case c == ']' || c == '}':
			d--
		}
	}
	return deepest
}

// ceiling reads a decoded limit as docs/estimation.md says.
func ceiling(v any) int64 {
	var raw []byte
	switch v := v.(type) {
	case json.Number:
		raw = []byte(v)
	case string:
		raw, _ = json.Marshal(v)
	default:
		return 0
	}
	return estimate.Ceiling(raw)
}

func outputOf(m map[string]any) int64 {
	out := max(ceiling(m["max_tokens"]), ceiling(m["max_completion_tokens"]), ceiling(m["max_output_tokens"]))
	if out <= 0 {
		out = estimate.DefaultOutput
	}
	prompts := 0
	if p, ok := m["prompt"].([]any); ok {
		for _, x := range p {
			switch x.(type) {
			case string, []any:
				prompts++
			}
		}
	}
	mult := big(out) * big(int64(max(prompts, 1))) * big(max(ceiling(m["n"]), ceiling(m["best_of"]), 1))
	if mult >= big(estimate.MaxTokens) {
		return estimate.MaxTokens
	}
	return int64(mult)
}

func big(n int64) float64 { return float64(n) }

// decodedBytes is the bytes of every key and string of a decoded value, except the
// media payloads docs/estimation.md prices as media: a base64 data URL under url,
// image_url or file_data; base64 under data or file_data in an object whose last type
// is "base64", or that has a format, or a media type that is not text/*.
func decodedBytes(v any, parent map[string]any) int64 {
	var n int64
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			n += int64(len(k))
			if s, ok := x.(string); ok && isMedia(k, s, v) {
				continue
			}
			n += decodedBytes(x, v)
		}
	case []any:
		for _, x := range v {
			n += decodedBytes(x, nil)
		}
	case string:
		n += int64(len(v))
	}
	return n
}

var base64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_="

func isBase64(s string) bool {
	return s != "" && strings.Trim(s, base64Alphabet) == ""
}

func isMedia(key, s string, obj map[string]any) bool {
	if key == "url" || key == "image_url" || key == "file_data" {
		if strings.HasPrefix(strings.ToLower(s), "data:") {
			if i := strings.IndexByte(s, ','); i >= 0 && strings.HasSuffix(strings.ToLower(s[:i]), ";base64") && isBase64(s[i+1:]) {
				return !strings.HasPrefix(strings.ToLower(strings.TrimSpace(s[5:i])), "text/")
			}
		}
	}
	if (key != "data" && key != "file_data") || !isBase64(s) {
		return false
	}
	// Which media-type key the estimator saw last depends on the order, which a map
	// loses: any media type that is not text/* may make it media.
	media := false
	for _, k := range []string{"media_type", "mime_type", "mimeType"} {
		if mt, ok := obj[k].(string); ok {
			if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(mt)), "text/") {
				media = true
			}
		}
	}
	if _, ok := obj["format"].(string); ok {
		media = true
	}
	return media || obj["type"] == "base64"
}

// generator writes JSON (mostly valid, sometimes not) from a program of bytes.
type generator struct {
	p []byte
	i int
}

func (g *generator) next() byte {
	if g.i >= len(g.p) {
		return 0
	}
	g.i++
	return g.p[g.i-1]
}

var keys = []string{"messages", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of", "model",
	"stream", "prompt", "input", "tools", "content", "data", "type", "media_type", "format", "url", "file_data", "text"}

// key writes a key the estimator knows, sometimes with an escape, another case or a
// byte that is not UTF-8.
func (g *generator) key(b *bytes.Buffer) {
	k := keys[int(g.next())%len(keys)]
	switch g.next() % 6 {
	case 0:
		i := int(g.next()) % len(k)
		k = k[:i] + fmt.Sprintf(`\u%04x`, k[i]) + k[i+1:]
	case 1:
		k = strings.ToUpper(k)
	case 2:
		k += "\xff"
	}
	b.WriteString(`"` + k + `":`)
}

func (g *generator) value(b *bytes.Buffer, d int) {
	switch c := g.next(); c % 12 {
	case 0:
		b.WriteString(`"` + strings.Repeat("word ", int(g.next())) + `"`)
	case 1:
		nums := []string{"1e30", "1e400", "-1e400", "4611686018427387904", "100", "0.5", `"250"`, `"1e999"`, "-3", "1E2"}
		b.WriteString(nums[int(g.next())%len(nums)])
	case 2:
		b.WriteString(`"data:image/png;base64,` + strings.Repeat("QUJD", int(g.next())) + `"`)
	case 3:
		b.WriteString(`"` + strings.Repeat("QUJD", int(g.next())) + `"`)
	case 4:
		b.WriteString(`"base64"`)
	case 5:
		b.WriteString(`"text/plain"`)
	case 6, 7:
		if d < 40 {
			g.object(b, d+1)
		} else {
			b.WriteString("null")
		}
	case 8, 9:
		b.WriteByte('[')
		n := int(g.next()) % 4
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			if d < 40 {
				g.value(b, d+1)
			} else {
				b.WriteString("1")
			}
		}
		b.WriteByte(']')
	case 10:
		// Deep nesting, sometimes past MaxDepth.
		n := int(g.next())*8 + int(g.next()%2)*estimate.MaxDepth
		b.WriteString(strings.Repeat("[", n) + strings.Repeat("]", n))
	default:
		b.WriteString([]string{"true", "false", "null", `"\ud800"`, "\"\x80\x80\x80\"", "NaN"}[int(g.next())%6])
	}
}

func (g *generator) object(b *bytes.Buffer, d int) {
	b.WriteByte('{')
	n := int(g.next()) % 6
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		g.key(b)
		g.value(b, d)
	}
	b.WriteByte('}')
}
