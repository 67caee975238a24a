// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fallback per master on a cluster. On one server (or a Sentinel primary) a failing
// call sends every admission to the fallback for the backoff. On a cluster only the
// master that failed is skipped: a reservation that touches a slot group it serves
// goes to the fallback for the backoff, and the others stay on Redis, exact. A master
// is known by the address the client's slot map gives the group; when a replica takes
// over its slots the map names the replica, and the groups go back to Redis at once.
// While no master is skipped, a reservation pays one atomic read for this.

// outageGap is how long a master must have gone without failing for its next failure
// to be a new outage, said again in the log.
const outageGap = 10 * time.Second

// nodeError is a call to one cluster master that failed.
type nodeError struct {
	node string
	err  error
}

func (e *nodeError) Error() string { return e.node + ": " + e.err.Error() }
func (e *nodeError) Unwrap() error { return e.err }

// errNodeDown is a reservation not sent because a master of its slot groups failed
// within the backoff.
var errNodeDown = errors.New("redis cluster master marked down after a recent failure")

// nodeOf is the address of the master that serves slot group g, as the client's slot
// map has it; "" when the map cannot be read (or on one server).
func (s *Store) nodeOf(g int) string {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	c, err := cc.MasterForKey(context.Background(), s.groups[g].key)
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// failedNode is the master whose call for slot group g failed with err: the address
// a connection error names, else the one the slot map gives the group now (the map
// may already name a replica that took over). A slot map that names its masters by
// hostname (cluster-preferred-endpoint-type hostname) is never matched by the IP
// address a connection error names: then the map's name stands.
func (s *Store) failedNode(g int, err error) string {
	mapped := s.nodeOf(g)
	var op *net.OpError
	if errors.As(err, &op) && op.Addr != nil {
		if host, _, e := net.SplitHostPort(mapped); e == nil && net.ParseIP(host) == nil {
			return mapped
		}
		return op.Addr.String()
	}
	return mapped
}

// downNode is a master of parts that failed within the backoff, or "".
func (s *Store) downNode(parts []*part) string {
	now := s.clock.Now().UnixNano()
	if now >= s.nodesDownUntil.Load() {
		return "" // no master skipped
	}
	for _, p := range parts {
		node := s.nodeOf(p.group)
		if until, ok := s.nodesDown.Load(node); ok && node != "" && now < until.(int64) {
			return node
		}
	}
	return ""
}

// markDownFor takes a reservation's failure: on a cluster, its master is skipped for
// the backoff; elsewhere (or when the master is not known) every admission is.
func (s *Store) markDownFor(err error) {
	var ne *nodeError
	if !errors.As(err, &ne) || ne.node == "" {
		s.markDown(err)
		return
	}
	if errors.Is(err, errNodeDown) {
		return // skipped, not failed: the backoff runs from the failure
	}
	now := s.clock.Now()
	until := now.Add(s.backoff).UnixNano()
	prev, known := s.nodesDown.Load(ne.node)
	if known && now.UnixNano() < prev.(int64) {
		return // already skipped
	}
	s.nodesDown.Store(ne.node, until)
	for {
		latest := s.nodesDownUntil.Load()
		if latest >= until || s.nodesDownUntil.CompareAndSwap(latest, until) {
			break
		}
	}
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		// The master may be gone and its replica promoted: ask the cluster who serves
		// which slots before the next try.
		cc.ReloadState(context.Background())
	}
	if known && now.UnixNano() < prev.(int64)+int64(outageGap) {
		s.log.Debug("A Redis Cluster master is still unreachable", "node", ne.node, "error", ne.err, "retry_in", s.backoff)
		return
	}
	action := "admitting their requests on this replica's share of each budget"
	if s.fallback.Load() == nil {
		action = "refusing their requests with 503"
	}
	msg := fmt.Sprintf("A Redis Cluster master is unreachable; the slot groups it serves are skipped, %s, until it answers", action)
	var refused redis.Error
	if errors.As(ne.err, &refused) {
		// The master answered, with an error (a user without the scripts' commands, a
		// Redis older than 7.0): it needs its operator, not patience.
		msg = fmt.Sprintf("A Redis Cluster master refused the budget scripts; the slot groups it serves are skipped, %s, until it runs them", action)
	}
	s.log.Warn(msg, "node", ne.node, "error", ne.err, "retry_in", s.backoff)
}
