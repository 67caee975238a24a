// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

// Tokenizers are the encodings a model of the registry may name in tokenizer
// (proxy/tokenize builds them; docs/estimation.md): its input is then counted with
// that encoding instead of estimated.
var Tokenizers = []string{"o200k_base", "cl100k_base"}
