// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Command fakellm serves the fake OpenAI- and Anthropic-compatible backend, for the
// demo and for trying the proxy on one machine without a real model.
package main

import (
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8000", "Address to serve on.")
	in := flag.Int64("input-tokens", 10, "Input tokens each response reports.")
	out := flag.Int64("output-tokens", 20, "Output tokens each response reports (and stream deltas).")
	latency := flag.Duration("latency", 0, "Delay before each response.")
	chunk := flag.Duration("chunk-delay", 0, "Delay before each stream chunk.")
	flag.Parse()

	s := fakellm.New()
	s.Set(fakellm.Behaviour{InputTokens: *in, OutputTokens: *out, Latency: *latency, ChunkDelay: *chunk})
	srv := &http.Server{Addr: *listen, Handler: s, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("fakellm: serving on http://%s (usage %d in, %d out)", *listen, *in, *out)
	log.Fatal(srv.ListenAndServe())
}
