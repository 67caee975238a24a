// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package tokenize

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tokenwarden/tokenwarden/proxy/estimate"
)

// decodedBody is the count of a body decoded by encoding/json into maps: what Body
// counts from the estimate's view must be the same.
func (e *Encoding) decodedBody(body []byte) (r Result, ok bool) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return Result{}, false
	}
	var floors, media int64
	for key, raw := range top {
		if jsonTextFields[key] {
			r.Text += e.Count(string(raw))
			continue
		}
		var v any
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			return Result{}, false
		}
		if a, isArray := v.([]any); isArray && (key == "messages" || key == "input") {
			floors += int64(len(a)) * estimate.MessageFloor
		}
		text, m := e.decodedWalk(v)
		r.Text += text
		media += m
	}
	r.Input = r.Text + floors + media
	return r, true
}

func (e *Encoding) decodedWalk(v any) (text, media int64) {
	stack := []any{v}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		switch v := v.(type) {
		case string:
			text += e.Count(v)
		case json.Number:
			text++
		case []any:
			stack = append(stack, v...)
		case map[string]any:
			h := decodedHint(v)
			for k, c := range v {
				if s, isString := c.(string); isString {
					if cost, isMedia := mediaCost(k, s, h); isMedia {
						media += cost
						continue
					}
				}
				stack = append(stack, c)
			}
		}
	}
	return text, media
}

func decodedHint(o map[string]any) hint {
	for _, k := range [...]string{"media_type", "mime_type", "mimeType"} {
		if mt, ok := o[k].(string); ok {
			return hint{media: !isText(mt), mediaType: mt}
		}
	}
	if _, ok := o["format"].(string); ok {
		return hint{media: true, mediaType: "audio/"}
	}
	if t, _ := o["type"].(string); t == "base64" {
		return hint{media: true}
	}
	return hint{}
}

// trickyBodies are bodies whose count depends on reading them as encoding/json does:
// escaped and duplicated keys, at the top and inside messages, media hints given
// twice or escaped, invalid UTF-8, numbers too large for a float64, many members.
var trickyBodies = []string{
	`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
	`{"m\u0065ssages":[{"role":"user","content":"first"}],"messages":[{"content":"second and longer text"},{"content":"x"}]}`,
	`{"messages":[{"role":"user","content":"one","content":"two three four"}]}`,
	`{"messages":[{"role":"user","model":"nested","content":[{"type":"text","text":"the model key is text here"}]}]}`,
	`{"messages":[{"content":[{"source":{"type":"base64","data":"QUJDRA==","media_type":"text/plain","media_type":"image/png"}}]}]}`,
	`{"messages":[{"content":[{"source":{"type":"base64","data":"QUJDRA==","media_type":"image/png","mime_type":"text/plain"}}]}]}`,
	`{"messages":[{"content":[{"source":{"typ\u0065":"base64","d\u0061ta":"QUJDRA=="}}]}]}`,
	`{"messages":[{"content":[{"input_audio":{"data":"QUJDRA==","format":"wav"}}]}]}`,
	`{"input":[{"type":"input_image","image_url":"data:image/png;base64,QUJDRA=="},{"type":"input_image","image_url":"data:text/plain;base64,QUJDRA=="}]}`,
	`{"tools":[{"type":"function","function":{"name":"f"}}],"tools":"\u00e9\ud800","text":{"format":{"type":"json"}}}`,
	"{\"prompt\":\"\xc3\x28\xa0\xa1\",\"\xff\":\"a\",\"\xfe\":\"bb bb\"}",
	`{"prompt":[1,2,3,1e400,-0.5],"max_tokens":1e400,"stream":true,"user":null}`,
	`{"messages":[],"input":"a string input","system":[{"type":"text","text":"be brief"}]}`,
	`{"messages":{"not":"an array"}}`,
	`{"messages":[{"content":"` + strings.Repeat("\\n\\t\\u00e9 \\\" ", 50) + `"}]}`,
	`{"metadata":{` + manyMembers(40) + `}}`,
	`{}`,
}

// manyMembers is n members, some keys repeated, for an object past the members' index.
func manyMembers(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k`)
		b.WriteByte(byte('a' + i%23))
		b.WriteString(`":"value `)
		b.WriteString(strings.Repeat("w ", i))
		b.WriteString(`"`)
	}
	return b.String()
}

// TestViewCountsAsDecoded: the count from the estimate's view is the count of the body
// decoded by encoding/json, on bodies whose count depends on how they are read.
func TestViewCountsAsDecoded(t *testing.T) {
	for _, name := range Names {
		e := Get(name)
		for _, body := range trickyBodies {
			want, wok := e.decodedBody([]byte(body))
			got, ok := e.Body([]byte(body))
			if ok != wok || got != want {
				t.Errorf("%s: %q counted %+v (%v), decoded %+v (%v)", name, body, got, ok, want, wok)
			}
		}
	}
}

// FuzzView: any body the estimator reads is counted from its view as encoding/json
// decodes it. Its seeds run with every go test.
func FuzzView(f *testing.F) {
	for _, s := range trickyBodies {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		est, err := estimate.BodyView(body)
		if err != nil || est.View() == nil {
			return
		}
		want, ok := Get(O200kBase).decodedBody(body)
		if !ok {
			t.Fatalf("the estimator read %q, encoding/json did not", body)
		}
		if got := Get(O200kBase).View(est.View()); got != want {
			t.Fatalf("%q: counted %+v, decoded %+v", body, got, want)
		}
	})
}
