// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"strconv"
	"time"
)

// Board is where a fleet's replicas share their billing cooldowns: the Redis they
// count in. Names are under the fleet's key prefix.
type Board interface {
	// Write sets name to value for ttl. A value it could not write it may send again
	// until it lands (redisstore's board does), a later value of the name first.
	Write(ctx context.Context, name string, value []byte, ttl time.Duration) error
	// Read returns the values of names, nil for one that is absent.
	Read(ctx context.Context, names []string) ([][]byte, error)
	// Claim sets name for ttl unless it is set, and reports whether it did.
	Claim(ctx context.Context, name string, ttl time.Duration) (bool, error)
}

// shared is a billing cooldown as the board holds it.
type shared struct {
	Cooling
	// Cleared: a probe found the account answering at Until.
	Cleared bool `json:"cleared,omitempty"`
}

// Board timings: how long a record outlives its interval (a replica that starts
// later still learns it), how long a replica's claim to probe holds, and how long a
// board call may take.
const (
	recordGrace  = time.Hour
	probeClaim   = 2 * time.Minute
	boardTimeout = time.Second
)

// Share makes the registry's billing cooldowns the fleet's: each learned or cleared
// here is written to b, Sync reads the others'.
func (r *Registry) Share(b Board, log *slog.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.board, r.log = b, log
	for cred, c := range r.cooldowns {
		c.notify = r.notifier(cred)
	}
}

// notifier is what a credential's cooldown tells the board through (nil without one).
func (r *Registry) notifier(cred string) func(Cooling, bool) {
	if r.board == nil {
		return nil
	}
	return func(c Cooling, cleared bool) { r.publish(cred, c, cleared) }
}

// publish writes a billing cooldown, or its clear, to the board.
func (r *Registry) publish(cred string, c Cooling, cleared bool) {
	v, err := json.Marshal(shared{Cooling: c, Cleared: cleared})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), boardTimeout)
	defer cancel()
	if err := r.board.Write(ctx, recordName(cred), v, c.Applied+recordGrace); err != nil {
		r.log.Warn("Could not share a billing cooldown with the fleet yet; the board sends it again until it lands", "upstream", c.Upstream, "cleared", cleared, "error", err)
	}
}

// Sync reads the fleet's billing cooldowns of creds from the board and applies them
// (Cooldown.Learn); without a board it does nothing.
func (r *Registry) Sync(ctx context.Context, creds []string) error {
	r.mu.Lock()
	b := r.board
	r.mu.Unlock()
	if b == nil || len(creds) == 0 {
		return nil
	}
	names := make([]string, len(creds))
	for i, c := range creds {
		names[i] = recordName(c)
	}
	ctx, cancel := context.WithTimeout(ctx, boardTimeout)
	defer cancel()
	vals, err := b.Read(ctx, names)
	if err != nil {
		return err
	}
	for i, v := range vals {
		var s shared
		if v == nil || json.Unmarshal(v, &s) != nil || s.Reason != ReasonBilling {
			continue
		}
		r.Cooldown(creds[i]).Learn(s.Cooling, s.Cleared)
	}
	return nil
}

// ClaimProbe reports whether this replica probes the billing cooldown of cred that
// began at since: always without a board, else when no other replica claimed it.
func (r *Registry) ClaimProbe(ctx context.Context, cred string, since time.Time) bool {
	r.mu.Lock()
	b := r.board
	r.mu.Unlock()
	if b == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, boardTimeout)
	defer cancel()
	ok, err := b.Claim(ctx, "health:probe:"+tag(cred)+":"+strconv.FormatInt(since.UnixMilli(), 10), probeClaim)
	return err == nil && ok
}

// recordName is the board's name of cred's billing cooldown.
func recordName(cred string) string { return "health:billing:" + tag(cred) }

// tag is a short hash of a credential's key: names hold no environment names.
func tag(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}
