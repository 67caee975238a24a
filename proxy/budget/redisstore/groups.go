// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"slices"
	"strconv"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Slot groups. On one server (or a Sentinel primary) every key carries the hash tag
// {prefix} and a reservation is one script call. On a Redis Cluster a script may only
// touch keys of one slot, so the keys are spread over SlotGroups slot groups, each its
// own hash tag {prefix:N}: a subject (a dimension and an id: one API key, one client,
// the global bucket, one model) belongs to group N = FNV-1a(dimension ":" id) mod
// SlotGroups, so its limits and every rule counter of it share a slot, and the fleet's
// subjects spread over the cluster's masters. A tenant's subject is its own (a tenant's
// global bucket is not the platform's): N = FNV-1a(tenant "/" dimension ":" id) mod
// SlotGroups, so the tenants' rules spread over the masters too, and a tenant's bucket
// never shares a script call with the platform's but by a collision of hashes. The
// platform's groups are as they were before tenants had levels.
//
// A reservation takes one script call per slot group it touches, in a fixed order: the
// platform's budgets first, then the tenant's (groupRank), so a refusal on a platform
// budget takes nothing from a tenant. Each call is all or nothing. When a
// group refuses, the groups already taken are released (their amounts refunded, best
// effort, before the refusal is answered); a release lost to a failing Redis leaves the budget
// charged: it counts high, never low, by at most one reservation's amounts per lost
// release, and the bucket returns it at its refill rate. Settlement (refunds and
// overage charges) is split by group the same way.
//
// Each slot group holds its own epoch key, {prefix:N}:epoch, with the fleet's epoch:
// a master that lost its data (restarted without persistence, say) fences the
// durable rules of its groups only.

// SlotGroups is how many slot groups a cluster's keys are spread over. It is fixed: a
// subject's group follows from its name, so every replica and every version agree on
// it.
const SlotGroups = 1024

// newGroups lays out the slot groups: one, the prefix, on one server; SlotGroups on a
// cluster.
func (s *Store) newGroups() []*group {
	if !s.sharded {
		return []*group{{name: s.name, prefix: s.prefix, key: s.prefix + epochKey}}
	}
	groups := make([]*group, SlotGroups)
	for i := range groups {
		name := s.name + ":" + strconv.Itoa(i)
		prefix := "{" + name + "}:"
		groups[i] = &group{name: name, prefix: prefix, key: prefix + epochKey}
	}
	return groups
}

// groupOf is the slot group of a bucket on a cluster: its subject's, in its tenant's
// level. Tenant names hold no '/' or ':', and dimension names no '/', so no tenant's
// subject hashes the string of another's or of the platform's.
func groupOf(k budget.Key) int {
	h := uint32(fnvOffset)
	if k.Tenant != "" {
		h = fnv1a(fnv1a(h, k.Tenant), "/")
	}
	h = fnv1a(fnv1a(fnv1a(h, k.Dim.String()), ":"), k.ID)
	return int(h % SlotGroups)
}

// FNV-1a, 32 bits (hash/fnv's New32a), over strings without copying them.
const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
)

func fnv1a(h uint32, s string) uint32 {
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= fnvPrime
	}
	return h
}

// groupRank orders the slot groups a reservation touches, within a level: the global
// budget, then the per-model and per-tenant ones, then team, user, API key and client;
// and every bucket of a tenant's rules after all of the platform's.
var groupRank = [budget.NumDimensions]int{
	budget.Global: 0, budget.Model: 1, budget.Tenant: 2, budget.Team: 3, budget.User: 4, budget.APIKey: 5, budget.Client: 6,
}

// rankOf is a bucket's place in the order of reservation.
func rankOf(ch *budget.Charge) int {
	if ch.Key.Tenant != "" {
		return int(budget.NumDimensions) + groupRank[ch.Key.Dim]
	}
	return groupRank[ch.Key.Dim]
}

// part is the share of a reservation that falls in one slot group.
type part struct {
	group, rank int
	// req and tok index the reservation's Requests and Tokens.
	req, tok []int
	r        budget.Reservation
}

// split cuts a reservation into its slot groups, in the order they are reserved.
func (s *Store) split(r *budget.Reservation) []*part {
	var parts []*part
	find := func(ch *budget.Charge) *part {
		g, rank := groupOf(ch.Key), rankOf(ch)
		for _, p := range parts {
			if p.group == g {
				p.rank = min(p.rank, rank)
				return p
			}
		}
		p := &part{group: g, rank: rank}
		parts = append(parts, p)
		return p
	}
	for i := range r.Requests {
		p := find(&r.Requests[i])
		p.req = append(p.req, i)
		p.r.Requests = append(p.r.Requests, r.Requests[i])
	}
	for i := range r.Tokens {
		p := find(&r.Tokens[i])
		p.tok = append(p.tok, i)
		p.r.Tokens = append(p.r.Tokens, r.Tokens[i])
	}
	slices.SortStableFunc(parts, func(a, b *part) int {
		if a.rank != b.rank {
			return a.rank - b.rank
		}
		return a.group - b.group
	})
	return parts
}

// reserveGroups reserves on a cluster: one script call per slot group, in order, each
// all or nothing; a refusal releases the groups already taken. A request-count
// refusal releases everything taken (a request refusal takes nothing); a token
// refusal releases the tokens taken and keeps the request counts, as one call would.
func (s *Store) reserveGroups(r *budget.Reservation) (budget.Result, error) {
	parts := s.split(r)
	res := budget.Result{
		Admitted:       true,
		Backend:        s,
		Shared:         true,
		RequestLevels:  make([]float64, len(r.Requests)),
		TokenLevels:    make([]float64, len(r.Tokens)),
		RequestSkipped: make([]bool, len(r.Requests)),
		TokenSkipped:   make([]bool, len(r.Tokens)),
	}
	// Until a group decides them, its buckets report their capacity.
	for i := range r.Requests {
		res.RequestLevels[i] = r.Requests[i].SharedCapacity
	}
	for i := range r.Tokens {
		res.TokenLevels[i] = r.Tokens[i].SharedCapacity
	}
	if node := s.downNode(parts); node != "" {
		return budget.Result{}, &downError{&nodeError{node: node, err: errNodeDown}}
	}
	var taken []*part
	var warned [][]bool // per taken part: its token buckets that warned
	for _, p := range parts {
		rep := s.run(call{kind: reserveCall, reservation: &p.r, group: p.group})
		if rep.err != nil {
			s.release(taken, warned, true)
			return budget.Result{}, &downError{&nodeError{node: s.failedNode(p.group, rep.err), err: rep.err}}
		}
		pr, err := parseReserve(rep.val, &p.r, s, p.group)
		if err != nil {
			s.release(taken, warned, true)
			return budget.Result{}, err
		}
		for j, i := range p.req {
			res.RequestLevels[i] = pr.RequestLevels[j]
			if pr.RequestWarned != nil && pr.RequestWarned[j] {
				if res.RequestWarned == nil {
					res.RequestWarned = make([]bool, len(r.Requests))
				}
				res.RequestWarned[i] = true
			}
		}
		for j, i := range p.tok {
			res.TokenLevels[i] = pr.TokenLevels[j]
			if pr.TokenWarned != nil && pr.TokenWarned[j] {
				if res.TokenWarned == nil {
					res.TokenWarned = make([]bool, len(r.Tokens))
				}
				res.TokenWarned[i] = true
			}
		}
		if !pr.Admitted {
			s.release(taken, warned, pr.RefusedBy == budget.Requests)
			res.Admitted, res.RefusedBy, res.RetryAfter = false, pr.RefusedBy, pr.RetryAfter
			if pr.RefusedBy == budget.Requests {
				res.Refused = p.req[pr.Refused]
			} else {
				res.Refused = p.tok[pr.Refused]
			}
			return res, nil
		}
		taken = append(taken, p)
		warned = append(warned, pr.TokenWarned)
	}
	return res, nil
}

// release returns what the parts took: their tokens (a warn bucket that did not fit
// took nothing), and their request counts too when requests is true. The refusal
// waits for it (one more round trip, shared with the pipeline's other calls), so a
// caller that reads the buckets after a refusal finds them as they were. A release
// that cannot reach Redis is lost and the budget stays charged until the buckets
// refill: it counts high, never low.
func (s *Store) release(taken []*part, warned [][]bool, requests bool) {
	var charges []budget.Charge
	for n, p := range taken {
		if requests {
			for _, ch := range p.r.Requests {
				if !ch.Warn {
					ch.Amount = 1
					charges = append(charges, ch)
				}
			}
		}
		for j, ch := range p.r.Tokens {
			if warned[n] == nil || !warned[n][j] {
				charges = append(charges, ch)
			}
		}
	}
	if len(charges) == 0 {
		return
	}
	s.releases.Add(1)
	if s.beforeRelease != nil {
		s.beforeRelease()
	}
	s.shared().SlotGroupRelease(s.refundShared(charges) != nil)
}

// stampGroups writes the fleet's epoch into every slot group that holds none (a
// cluster; one server has only the group that drew it). A group that holds another
// epoch keeps it, and its durable rules are fenced at their first admission.
func (s *Store) stampGroups(ctx context.Context, epoch string) error {
	if !s.sharded {
		return nil
	}
	if err := stampScript.Load(ctx, s.c).Err(); err != nil {
		return err
	}
	pipe := s.c.Pipeline()
	for _, g := range s.groups[1:] {
		stampScript.EvalSha(ctx, pipe, []string{g.key}, epoch)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// splitCharges cuts settlement charges by slot group, in the order first seen: the
// indexes of each group's charges.
func splitCharges(charges []budget.Charge) [][]int {
	var groups []int
	var out [][]int
	for n, ch := range charges {
		g := groupOf(ch.Key)
		i := slices.Index(groups, g)
		if i < 0 {
			i = len(groups)
			groups = append(groups, g)
			out = append(out, nil)
		}
		out[i] = append(out[i], n)
	}
	return out
}
