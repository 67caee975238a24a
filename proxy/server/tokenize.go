// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"github.com/tokenwarden/tokenwarden/proxy/tokenize"
)

// tokenize counts the request's input with its model's tokenizer: the budget
// reservation's input becomes the tokenizer's count plus the estimate's allowances
// for media and message framing, and the context-window pre-check reads the
// tokenizer's count of the text in place of the estimate's lower bound. A body
// encoding/json does not decode keeps the estimate.
func (ex *exchange) tokenize(enc *tokenize.Encoding) {
	if r, ok := enc.Body(ex.try.Body); ok {
		ex.est.Tokenize(r.Input, r.Text)
	}
}
