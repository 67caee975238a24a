// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"slices"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/admin"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// Health timing: how often a replica reads the fleet's billing cooldowns and looks
// for one due to probe, and the least time between two of its own probes of one.
const (
	DefaultHealthEvery = time.Second
	selfProbeEvery     = time.Minute
)

// RunHealth runs SyncHealth every every (DefaultHealthEvery when 0) until ctx ends.
func (s *Server) RunHealth(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultHealthEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.SyncHealth(ctx)
		}
	}
}

// SyncHealth learns the billing cooldowns the fleet's other replicas found (from the
// Redis it counts in, when it has one), then probes each credential whose billing
// cooldown's interval has passed and that no other replica is probing: one upstream
// of it gets a one-token call (admin.Probe), and its answer clears the cooldown,
// relearns it, or turns it into a rate cooldown.
func (s *Server) SyncHealth(ctx context.Context) {
	rt := s.rt.Load()
	if rt == nil {
		return
	}
	creds := credentials(rt.Upstreams)
	if err := s.health.Sync(ctx, creds); err != nil {
		s.log.Warn("Could not read the fleet's billing cooldowns", "error", err)
	}
	now := s.clock.Now()
	for _, cred := range creds {
		cd := s.health.Cooldown(cred)
		if !cd.TryProbe(now, selfProbeEvery) {
			continue
		}
		s.selfProbe(ctx, rt, cred, now)
		cd.ProbeDone()
	}
}

// selfProbe probes the first upstream of rt that has cred and a model to probe with,
// if no other replica claimed the probe of this billing cooldown.
func (s *Server) selfProbe(ctx context.Context, rt *runtime, cred string, now time.Time) {
	cd := s.health.Cooldown(cred)
	st, ok := cd.State(now)
	if !ok || !s.health.ClaimProbe(ctx, cred, st.Since) {
		return
	}
	for _, up := range rt.Upstreams {
		if up.CredKey != cred {
			continue
		}
		t, err := s.ProbeTarget(up.Name)
		if err != nil {
			continue
		}
		res, err := admin.Probe(ctx, t)
		if err != nil {
			continue
		}
		s.log.Info("Probed a credential whose billing cooldown's interval passed", "upstream", up.Name,
			"status", res.Status, "error", res.Error, "cleared", res.Cleared)
		return
	}
}

// credentials are the distinct credential keys of ups, in order.
func credentials(ups []*upstream.Upstream) []string {
	var out []string
	for _, up := range ups {
		if !slices.Contains(out, up.CredKey) {
			out = append(out, up.CredKey)
		}
	}
	return out
}
