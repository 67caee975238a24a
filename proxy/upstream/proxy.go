// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package upstream

import (
	"log"
	"net/http"
	"net/http/httputil"
	"sync"

	"github.com/tokenwarden/tokenwarden/proxy/refusal"
)

// Hooks are what the request path gives an upstream's reverse proxy.
type Hooks struct {
	// Prepare sets on the outgoing request what the request decides (its path, its
	// trace context, the encodings offered) and reports the request's API family.
	Prepare        func(pr *httputil.ProxyRequest) refusal.Family
	ModifyResponse func(*http.Response) error
	ErrorHandler   func(http.ResponseWriter, *http.Request, error)
	ErrorLog       *log.Logger
}

// NewReverseProxy is up's reverse proxy over tr. The client's credential never reaches
// the backend; the upstream's own goes in the header of the request's API family.
func NewReverseProxy(up *Upstream, tr http.RoundTripper, h Hooks) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			family := h.Prepare(pr)
			pr.SetURL(up.Target)
			pr.SetXForwarded()
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("X-Api-Key")
			if up.Credential != "" {
				if family == refusal.Anthropic {
					pr.Out.Header.Set("X-Api-Key", up.Credential)
				} else {
					pr.Out.Header.Set("Authorization", "Bearer "+up.Credential)
				}
			}
		},
		Transport:      tr,
		BufferPool:     Buffers,
		ModifyResponse: h.ModifyResponse,
		ErrorHandler:   h.ErrorHandler,
		ErrorLog:       h.ErrorLog,
	}
}

// BufferPool lends the reverse proxy its copy buffers (and the usage reader's
// decoder its own). A sync.Pool keeps pointers, and the reverse proxy's interface
// passes slices: the pointers a Get empties are kept in holders for the next Put,
// which then allocates nothing.
type BufferPool struct{ p, holders sync.Pool }

// Buffers are the 32 KiB copy buffers of every reverse proxy.
var Buffers = &BufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}

// Get lends a buffer.
func (b *BufferPool) Get() []byte {
	h := b.p.Get().(*[]byte)
	buf := *h
	*h = nil
	b.holders.Put(h)
	return buf
}

// Put gives a buffer back.
func (b *BufferPool) Put(p []byte) {
	h, _ := b.holders.Get().(*[]byte)
	if h == nil {
		h = new([]byte)
	}
	*h = p
	b.p.Put(h)
}
