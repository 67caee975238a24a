// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/test/testproc"
)

// Cluster is a Redis Cluster of redis-server processes on free loopback ports: its
// masters share the 16384 slots evenly, and each may have replicas. It is set up
// with CLUSTER ADDSLOTSRANGE, MEET and REPLICATE (no redis-cli) and torn down when the
// test ends.
type Cluster struct {
	// Masters are the nodes that were given the slots; Replicas[i] replicate
	// Masters[i]. After a failover a replica is a master: read the roles from the
	// cluster, not from these.
	Masters  []*Server
	Replicas [][]*Server
}

// NodeTimeout is the cluster's node timeout: a master that does not answer for this
// long is failed over to its replica.
const NodeTimeout = 500 * time.Millisecond

// StartCluster starts masters masters with replicas replicas each, and waits until
// every node reports the cluster ok.
// A cluster that does not form (a node that did not start, gossip that did not
// converge on a loaded machine) is torn down and started again, twice at most: what
// failed is logged, and the test fails only when the third attempt fails too.
func StartCluster(t TB, masters, replicas int) *Cluster {
	t.Helper()
	for attempt := 1; ; attempt++ {
		try := &attemptTB{TB: t}
		c, err := try.run(func() *Cluster { return startCluster(try, masters, replicas) })
		if err == nil {
			try.keep()
			return c
		}
		try.discard()
		if attempt == 3 {
			t.Fatalf("redisserver: the cluster did not form in %d attempts: %v", attempt, err)
		}
		t.Logf("redisserver: the cluster did not form (attempt %d), starting it again: %v", attempt, err)
	}
}

func startCluster(t TB, masters, replicas int) *Cluster {
	t.Helper()
	node := func() *Server {
		return startWith(t, func(port int, dir string) (string, []string) {
			bus, err := testproc.FreePort()
			if err != nil {
				t.Fatalf("redisserver: no free port: %v", err)
			}
			return "", []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
				"--cluster-port", strconv.Itoa(bus),
				"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout / time.Millisecond)),
				"--cluster-require-full-coverage", "no",
				"--cluster-allow-replica-migration", "no",
			}
		})
	}
	c := &Cluster{}
	for range masters {
		c.Masters = append(c.Masters, node())
		var rs []*Server
		for range replicas {
			rs = append(rs, node())
		}
		c.Replicas = append(c.Replicas, rs)
	}
	ctx := context.Background()
	all := c.nodes()
	for i, m := range c.Masters {
		first, last := i*16384/masters, (i+1)*16384/masters-1
		if err := m.client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", first, last).Err(); err != nil {
			t.Fatalf("redisserver: CLUSTER ADDSLOTSRANGE on %s: %v", m.Addr(), err)
		}
	}
	seed := all[0].client()
	for _, n := range all[1:] {
		if err := seed.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.port, n.busPort()).Err(); err != nil {
			t.Fatalf("redisserver: CLUSTER MEET %s: %v", n.Addr(), err)
		}
	}
	// A replica can replicate a master once it knows it.
	for i, rs := range c.Replicas {
		id := c.Masters[i].ID()
		for _, r := range rs {
			eventually(t, 10*time.Second, "replica "+r.Addr()+" knows its master", func() error {
				return r.client().Do(ctx, "CLUSTER", "REPLICATE", id).Err()
			})
		}
	}
	c.WaitOK(t)
	for _, rs := range c.Replicas {
		waitSynced(t, rs)
	}
	return c
}

// nodes are every node started, masters first.
func (c *Cluster) nodes() []*Server {
	all := append([]*Server(nil), c.Masters...)
	for _, rs := range c.Replicas {
		all = append(all, rs...)
	}
	return all
}

// URL is the cluster's redis+cluster:// URL, naming every node as a seed.
func (c *Cluster) URL() string {
	var addrs []string
	for _, n := range c.nodes() {
		addrs = append(addrs, n.Addr())
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// WaitOK waits until every running node reports cluster_state:ok, knows every slot
// served, and agrees with the others on who serves each.
func (c *Cluster) WaitOK(t TB) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 20*time.Second, "the cluster is ok on every node", func() error {
		var want string
		for _, n := range c.nodes() {
			if !n.Running() {
				continue
			}
			info, err := n.client().ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				return fmt.Errorf("%s: %s", n.Addr(), info)
			}
			shards, err := n.shards(ctx)
			if err != nil {
				return err
			}
			got := ""
			for _, sh := range shards {
				got += fmt.Sprintf("%d-%d:%s ", sh.start, sh.end, sh.master)
			}
			if want == "" {
				want = got
			} else if got != want {
				return fmt.Errorf("%s sees %s, another %s", n.Addr(), got, want)
			}
		}
		return nil
	})
}

// MasterOf is the node that serves key's slot now, as the first running node that
// knows an online master for it sees it; nil when none does (a master failed and its
// replica is not promoted yet).
func (c *Cluster) MasterOf(t TB, key string) *Server {
	t.Helper()
	ctx := context.Background()
	for _, n := range c.nodes() {
		if !n.Running() {
			continue
		}
		shards, err := n.shards(ctx)
		if err != nil {
			continue
		}
		slot := int64(Slot(key))
		for _, sh := range shards {
			if slot >= sh.start && slot <= sh.end {
				for _, m := range c.nodes() {
					if m.Addr() == sh.master {
						return m
					}
				}
			}
		}
	}
	return nil
}

// MoveSlot migrates a slot with its keys from one master to another, as a resharding
// does: the slot is marked importing and migrating (clients are sent ASK while its
// keys move), its keys are moved with MIGRATE, and then every node is told its new
// owner (clients are sent MOVED).
func (c *Cluster) MoveSlot(t TB, slot int, from, to *Server) {
	t.Helper()
	ctx := context.Background()
	src, dst := from.client(), to.client()
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("redisserver: %s: %v", what, err)
		}
	}
	must("SETSLOT IMPORTING", dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.ID()).Err())
	must("SETSLOT MIGRATING", src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.ID()).Err())
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		must("GETKEYSINSLOT", err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must("MIGRATE", src.Do(ctx, args...).Err())
	}
	for _, n := range []*Server{to, from} {
		must("SETSLOT NODE", n.client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.ID()).Err())
	}
	for _, n := range c.nodes() {
		if n.Running() && n != to && n != from {
			_ = n.client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.ID()).Err()
		}
	}
}

// shard is a range of slots and the address of the master that serves it.
type shard struct {
	start, end int64
	master     string
}

// shards are the slot ranges this node knows a master for, as it sees them.
func (s *Server) shards(ctx context.Context) ([]shard, error) {
	shards, err := s.client().ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []shard
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role == "master" && n.Health == "online" {
				for _, r := range sh.Slots {
					out = append(out, shard{start: r.Start, end: r.End, master: fmt.Sprintf("%s:%d", n.IP, n.Port)})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b shard) int { return int(a.start - b.start) })
	return out, nil
}

// ID is the node's cluster id.
func (s *Server) ID() string {
	id, err := s.client().Do(context.Background(), "CLUSTER", "MYID").Text()
	if err != nil {
		return ""
	}
	return id
}

// busPort is the cluster bus port the node was started with.
func (s *Server) busPort() string {
	for i, a := range s.args {
		if a == "--cluster-port" && i+1 < len(s.args) {
			return s.args[i+1]
		}
	}
	return strconv.Itoa(s.port + 10000)
}

// Client is a client of this one node (cluster and sentinel tests use it to flush or
// inspect one node).
func (s *Server) Client() *redis.Client { return s.client() }

// client is a client of this one node, closed when the test ends.
func (s *Server) client() *redis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admin == nil {
		s.admin = redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
	}
	return s.admin
}

// Slot is the cluster slot of a key (CRC16 of its hash tag, modulo 16384).
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM, the cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// eventually retries f until it succeeds or the time is up.
func eventually(t TB, within time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redisserver: %s: not within %s: %v", what, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeFile writes a config file into dir.
func writeFile(t TB, dir, name, text string) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatalf("redisserver: %v", err)
	}
	return p
}

// attemptTB is one attempt at a setup: its Fatalf ends the attempt rather than the
// test, and its cleanups run when the attempt is discarded or, when it is kept, when
// the test ends.
type attemptTB struct {
	TB
	cleanups []func()
}

// errAttempt carries an attempt's failure out of the setup it ended.
type errAttempt struct{ err error }

func (a *attemptTB) Cleanup(f func()) { a.cleanups = append(a.cleanups, f) }

func (a *attemptTB) Fatalf(format string, args ...any) {
	panic(errAttempt{fmt.Errorf(format, args...)})
}

// run calls setup and returns its result, or the failure that ended it.
func (a *attemptTB) run(setup func() *Cluster) (c *Cluster, err error) {
	defer func() {
		if r := recover(); r != nil {
			failed, ok := r.(errAttempt)
			if !ok {
				panic(r)
			}
			err = failed.err
		}
	}()
	return setup(), nil
}

// keep hands the attempt's cleanups to the test, in the order they were registered.
func (a *attemptTB) keep() {
	for _, f := range a.cleanups {
		a.TB.Cleanup(f)
	}
}

// discard runs the attempt's cleanups now, last registered first.
func (a *attemptTB) discard() {
	for _, f := range slices.Backward(a.cleanups) {
		f()
	}
}
