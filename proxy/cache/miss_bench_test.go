// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/cache"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

type stateKey struct{}

// BenchmarkMiss is the response cache's own work on a request it misses, without the
// request around it: the key, the lookup, leading a coalescing call and its upstream
// context, the answer recorded as it passes, and the entry stored.
func BenchmarkMiss(b *testing.B) {
	body := []byte(`{"model":"gpt-4o","max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Summarise the plot of a long novel in three sentences, please (000000000)."}]}`)
	answer := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":20,"completion_tokens":5}}`)
	header := http.Header{"Content-Type": {"application/json"}}
	reqHeader := http.Header{"Authorization": {"Bearer sk-alice"}, "Content-Type": {"application/json"}}
	store := cache.NewMemory(newClock(), time.Minute, 64<<20)
	group := cache.NewGroup(1 << 20)
	ctx := context.Background()
	var rec cache.Recorder
	b.ReportAllocs()
	for i := range b.N {
		n := strconv.AppendInt(body[:len(body)-14], int64(i), 10)
		r := cache.Request{Scope: "key:alice", Route: "/v1/chat/completions", Upstream: "default", Model: "gpt-4o", Header: reqHeader, Body: n}
		k := r.Key()
		if _, ok := store.Get(ctx, k); ok {
			b.Fatal("a hit")
		}
		call, _ := group.Join(ctx, k)
		_ = call.Context(ctx, stateKey{}, i)
		call.Head(200, header)
		rec.Reset(1<<20, false)
		rec.Share(call)
		_, _ = rec.Write(answer)
		e, _ := rec.Entry(cache.Answer{Status: 200, Header: header, End: usage.Complete, Verdict: usage.Settle})
		store.Put(ctx, k, e)
		call.Finish(true, usage.Usage{Input: 20, Output: 5})
	}
}
