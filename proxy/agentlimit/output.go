// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package agentlimit

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/estimate"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// CapOutput applies the class's max_output_tokens, lim's, to a charged request of the
// route whose body is body and estimate est: a stated limit above the cap is refused
// (over_max_output_tokens: refuse) or lowered to it, and a request that states none
// gets the cap. A changed body is returned with its estimate; out is nil when the
// body stands.
func CapOutput(lim config.ClassLimits, class schedule.Class, route string, body []byte, est estimate.Estimate) (out []byte, outEst estimate.Estimate, ref *Refusal) {
	if lim.MaxOutputTokens <= 0 {
		return nil, est, nil
	}
	limCap := lim.MaxOutputTokens
	if est.Output <= limCap && est.Output != estimate.DefaultOutput {
		// The request states a limit (the default is what it reserves without one), and
		// every completion's is at most its total: nothing to read.
		return nil, est, nil
	}
	spans, kept := keptLimits(&est)
	if !kept {
		// Not a JSON object: the estimate's fallback stands, and the upstream refuses it.
		return nil, est, nil
	}
	var over []outputSpan
	for _, s := range spans {
		if s.value > limCap {
			over = append(over, s)
		}
	}
	if len(spans) > 0 && len(over) == 0 {
		return nil, est, nil
	}
	if len(over) > 0 && lim.OverMaxOutputTokens == config.OverRefuse {
		return nil, est, refuse(class, http.StatusBadRequest, codeMaxTokens, limitMaxTokens,
			fmt.Sprintf("%s is %d, above the %s class's cap of %d output tokens: send %d or less",
				over[0].field, over[0].value, class, limCap, limCap),
			map[string]any{"param": over[0].field, "max_output_tokens": limCap})
	}
	field := outputField(route)
	if len(spans) == 0 {
		out = insertOutputLimit(body, field, limCap)
	} else {
		out = replaceSpans(body, over, limCap)
	}
	// The estimate follows the rewrite: the body is not read again.
	return out, est.WithOutputLimit(field, limCap), nil
}

// keptLimits are the output limits the estimate kept of the body, as spans.
func keptLimits(est *estimate.Estimate) ([]outputSpan, bool) {
	limits, ok := est.OutputLimits()
	if !ok {
		return nil, false
	}
	spans := make([]outputSpan, 0, len(limits))
	for _, l := range limits {
		spans = append(spans, outputSpan{field: l.Field, value: l.Value, start: int(l.Start), end: int(l.End)})
	}
	return spans, true
}

// SetBody makes out the request's body, forwarded plain.
func SetBody(r *http.Request, out []byte) {
	r.Body = io.NopCloser(bytes.NewReader(out))
	r.ContentLength = int64(len(out))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(out)), nil }
	r.Header.Del("Content-Encoding")
	r.Header.Set("Content-Length", strconv.Itoa(len(out)))
}

// outputField is the output limit a route reads.
func outputField(route string) string {
	switch route {
	case "/v1/responses", "/v1/responses/compact":
		return "max_output_tokens"
	case "/v1/chat/completions":
		return "max_completion_tokens"
	}
	return "max_tokens"
}

// outputSpan is one top-level output limit of a body: its field, value, and where its
// value's bytes are.
type outputSpan struct {
	field      string
	value      int64
	start, end int
}

// replaceSpans writes limCap in place of each span's value.
func replaceSpans(body []byte, spans []outputSpan, limCap int64) []byte {
	v := strconv.FormatInt(limCap, 10)
	out := make([]byte, 0, len(body)+len(v)*len(spans))
	at := 0
	for _, s := range spans {
		out = append(out, body[at:s.start]...)
		out = append(out, v...)
		at = s.end
	}
	return append(out, body[at:]...)
}

// insertOutputLimit adds "field": limCap as a JSON object's first member.
func insertOutputLimit(body []byte, field string, limCap int64) []byte {
	i := bytes.IndexByte(body, '{')
	member := `"` + field + `":` + strconv.FormatInt(limCap, 10)
	if len(bytes.TrimSpace(body[i+1:])) > 1 { // more than the closing brace
		member += ","
	}
	out := make([]byte, 0, len(body)+len(member))
	out = append(out, body[:i+1]...)
	out = append(out, member...)
	return append(out, body[i+1:]...)
}
