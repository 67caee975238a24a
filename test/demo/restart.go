// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/tokenwarden/tokenwarden/test/redisserver"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

// recoverTimeout bounds the wait for the fleet's own attestation: the operator's
// in-flight grace of 30 s, a Lease renewal and a flush.
const recoverTimeout = 90 * time.Second

// restartStory tells how the Redis fleet's dollar budget comes back on its own after
// Redis restarts without its data: the trust fence refuses, and once every proxy has
// flushed its spend into the ledger past the loss, the fleet attests the counters
// from it. remaining is carol's balance before the restart.
func restartStory(ctx context.Context, s *stack.Stack, st *story, rs *redisserver.Server, url string, remaining float64) error {
	// The fleet's epoch must be on record, and in every proxy's config, for a loss
	// to be told from a brand-new Redis.
	deadline := time.Now().Add(enforceTimeout)
	for {
		out, err := s.Kubectl("get", "tp", "-n", ns, "fleet-redis", "-o", "jsonpath={.status.durableEpochs[0].epoch}")
		if err == nil && out != "" {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			st.check(false, "the operator records the fleet's epoch of durable counters")
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := s.WaitEnforced(ctx, ns, "fleet-redis", enforceTimeout); err != nil {
		return err
	}
	say("")
	say("Redis restarts without persistence: every counter is gone, carol's $%.2f spent of $25 with them.", 25-remaining)
	if err := rs.Restart(); err != nil {
		return err
	}
	var a answer
	var err error
	deadline = time.Now().Add(enforceTimeout)
	for {
		if a, err = chat(url, "sk-demo-carol", 1000); err != nil {
			return err
		}
		if a.code == 503 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	say("carol → proxy 0: %d, Retry-After: %s s; body: %s", a.code, a.header.Get("Retry-After"), errorMessage(a))
	st.check(a.code == 503 && code(a) == "budget_recovering",
		"the trust fence refuses her dollar budget with 503 budget_recovering: an empty counter would be a whole $25 again")
	start := time.Now()
	deadline = start.Add(recoverTimeout)
	for a.code != 200 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Second)
		if a, err = chat(url, "sk-demo-carol", 1000); err != nil {
			return err
		}
	}
	left, _ := strconv.ParseFloat(a.header.Get("X-Tokenwarden-Budget-Cost-Remaining"), 64)
	say("%.0fs later, nobody having attested anything: carol → proxy 0: %d, x-tokenwarden-budget-cost-remaining: $%s",
		time.Since(start).Seconds(), a.code, a.header.Get("X-Tokenwarden-Budget-Cost-Remaining"))
	if out, err := s.Kubectl("get", "events", "-n", ns, "--field-selector", "reason=AttestedFromLedger", "-o",
		"custom-columns=REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message"); err == nil {
		indent(out)
	}
	// The answer itself cost about a cent: the balance is what the ledger holds.
	st.check(a.code == 200 && math.Abs(left-remaining) < 0.05,
		fmt.Sprintf("the fleet attested the counters from its spend ledger on its own: $%.2f remain, as before the restart", left))
	return nil
}

// code is an error answer's code.
func code(a answer) string {
	if e, ok := a.body["error"].(map[string]any); ok {
		if c, ok := e["code"].(string); ok {
			return c
		}
	}
	return ""
}
