// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisserver

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Sentinel is a primary with replicas watched by sentinels (redis-server --sentinel),
// all on free loopback ports, torn down when the test ends.
type Sentinel struct {
	// Name is the master's name the sentinels monitor.
	Name string
	// Data are the data nodes, the first the initial primary.
	Data []*Server
	// Sentinels are the sentinel processes.
	Sentinels []*Server
}

// DownAfter is how long the sentinels wait for a primary that does not answer before
// they fail it over.
const DownAfter = 500 * time.Millisecond

// StartSentinel starts a primary with replicas replicas and sentinels sentinels (a
// quorum of a majority of them), and waits until the sentinels see the replicas.
func StartSentinel(t TB, replicas, sentinels int) *Sentinel {
	t.Helper()
	ctx := context.Background()
	st := &Sentinel{Name: "tokenwarden"}
	primary := Start(t)
	st.Data = append(st.Data, primary)
	for range replicas {
		r := Start(t)
		if err := r.client().ReplicaOf(ctx, "127.0.0.1", fmt.Sprint(primary.port)).Err(); err != nil {
			t.Fatalf("redisserver: REPLICAOF: %v", err)
		}
		st.Data = append(st.Data, r)
	}
	waitSynced(t, st.Data[1:])
	quorum := sentinels/2 + 1
	for range sentinels {
		st.Sentinels = append(st.Sentinels, startWith(t, func(port int, dir string) (string, []string) {
			conf := writeFile(t, dir, "sentinel.conf", fmt.Sprintf(
				"sentinel monitor %s 127.0.0.1 %d %d\n"+
					"sentinel down-after-milliseconds %s %d\n"+
					"sentinel failover-timeout %s 5000\n"+
					"sentinel parallel-syncs %s 1\n",
				st.Name, primary.port, quorum, st.Name, DownAfter/time.Millisecond, st.Name, st.Name))
			return conf, []string{"--sentinel"}
		}))
	}
	eventually(t, 20*time.Second, "the sentinels see every replica and each other", func() error {
		for _, s := range st.Sentinels {
			info, err := s.client().Info(ctx, "sentinel").Result()
			if err != nil {
				return err
			}
			want := fmt.Sprintf("slaves=%d,sentinels=%d", replicas, sentinels)
			if !strings.Contains(info, want) {
				return fmt.Errorf("%s: %s, want %s", s.Addr(), info, want)
			}
		}
		return nil
	})
	return st
}

// URL is the redis+sentinel:// URL naming the sentinels and the master.
func (st *Sentinel) URL() string {
	var addrs []string
	for _, s := range st.Sentinels {
		addrs = append(addrs, s.Addr())
	}
	return "redis+sentinel://" + strings.Join(addrs, ",") + "/" + st.Name
}

// Primary is the data node the sentinels name as the primary now.
func (st *Sentinel) Primary(t TB) *Server {
	t.Helper()
	addr, err := st.Sentinels[0].client().Do(context.Background(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", st.Name).StringSlice()
	if err != nil || len(addr) != 2 {
		t.Fatalf("redisserver: SENTINEL GET-MASTER-ADDR-BY-NAME: %v %v", addr, err)
	}
	for _, d := range st.Data {
		if d.Addr() == addr[0]+":"+addr[1] {
			return d
		}
	}
	t.Fatalf("redisserver: the sentinels name %v, not a data node", addr)
	return nil
}

// WaitPrimary waits until the sentinels name a primary other than old, and it answers
// as a master.
func (st *Sentinel) WaitPrimary(t TB, old *Server) *Server {
	t.Helper()
	var p *Server
	eventually(t, 30*time.Second, "the sentinels fail over", func() error {
		addr, err := st.Sentinels[0].client().Do(context.Background(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", st.Name).StringSlice()
		if err != nil || len(addr) != 2 {
			return fmt.Errorf("%v: %w", addr, err)
		}
		if addr[0]+":"+addr[1] == old.Addr() {
			return fmt.Errorf("still %s", old.Addr())
		}
		p = st.Primary(t)
		role, err := p.client().Do(context.Background(), "ROLE").Slice()
		if err != nil {
			return fmt.Errorf("%s: %w", p.Addr(), err)
		}
		if len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("%s: role %v", p.Addr(), role)
		}
		return nil
	})
	return p
}
