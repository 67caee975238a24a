// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// StartDrain marks a stopping proxy: /readyz answers 503 from now on, so that the
// endpoints stop sending it new requests, while the requests that arrive meanwhile and
// those in flight are still served.
func (s *Server) StartDrain() { s.draining.Store(true) }

// Draining reports whether StartDrain was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// WaitSettled waits until every settlement and release that runs off the request
// goroutines (Redis storage) is done, or ctx ends. Call it once no request is in
// flight: then every hold is settled or released.
func (s *Server) WaitSettled(ctx context.Context) error { return s.limiter.Wait(ctx) }

// DrainTimeout is the drain the config in force asks for (config.DrainTimeout), or
// config.DefaultUpstreamTimeout before the first config.
func (s *Server) DrainTimeout() time.Duration {
	rt := s.rt.Load()
	if rt == nil {
		return config.DrainTimeout()
	}
	return rt.cfg.DrainTimeout()
}
