// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package upstream

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Transports keeps one tuned transport per upstream URL and timeout across reloads, so
// a reload does not drop the connection pools. The zero value is ready for use.
type Transports struct {
	mu sync.Mutex
	m  map[string]*http.Transport
}

// Get is the transport of an upstream's URL and timeout.
func (t *Transports) Get(u config.Upstream) *http.Transport {
	key := fmt.Sprintf("%s|%d", u.URL, u.TimeoutSeconds)
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr, ok := t.m[key]; ok {
		return tr
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 1024
	tr.MaxIdleConnsPerHost = 256
	tr.IdleConnTimeout = 90 * time.Second
	tr.ResponseHeaderTimeout = time.Duration(u.TimeoutSeconds) * time.Second
	tr.ForceAttemptHTTP2 = true
	if t.m == nil {
		t.m = map[string]*http.Transport{}
	}
	t.m[key] = tr
	return tr
}
