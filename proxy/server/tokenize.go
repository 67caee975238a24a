// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"github.com/tokenwarden/tokenwarden/proxy/tokenize"
)

// tokenize counts the request's input with its model's candidates' encodings, and
// keeps the largest count: the budget reservation's input becomes it plus the
// estimate's allowances for media and message framing, and the context-window
// pre-check reads the largest count of the text in place of the estimate's lower
// bound. It counts the estimate's view of the body (an unavailable model's substitute
// counts it again, with its own encodings); a body that is not a JSON object has none
// and keeps the estimate.
func (ex *exchange) tokenize(encs []*tokenize.Encoding) {
	v := ex.est.View()
	if v == nil {
		return
	}
	var in, text int64
	for _, enc := range encs {
		r := enc.View(v)
		in, text = max(in, r.Input), max(text, r.Text)
	}
	ex.est.Tokenize(in, text)
}
