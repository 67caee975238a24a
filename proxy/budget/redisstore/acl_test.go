// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// userCommands are the commands docs/redis.md gives a fleet's user: the scripts and
// what they call, the epoch, and SCAN for the usage report. A cluster's user also
// reads the slot map (clusterCommands).
var (
	userCommands    = []string{"+evalsha", "+script|load", "+time", "+mget", "+psetex", "+get", "+set", "+scan"}
	clusterCommands = []string{"+cluster|slots"}
)

// restrictUser creates user on every node (ACLs are a node's own: neither a cluster
// nor a replica shares them) with password pw, the keys of pattern and commands.
func restrictUser(nodes []*redisserver.Server, user, pattern string, commands []string) {
	for _, n := range nodes {
		args := []any{"ACL", "SETUSER", user, "reset", "on", ">pw", pattern}
		for _, c := range commands {
			args = append(args, c)
		}
		Expect(n.Client().Do(context.Background(), args...).Err()).To(Succeed())
		DeferCleanup(func() { _ = n.Client().Do(context.Background(), "ACL", "DELUSER", user).Err() })
	}
}

// exerciseFleet runs every budget operation of a fleet as the URL's user: a reservation
// on six dimensions, one refused (released on a cluster), a refund, an overage, a
// durable rule's epoch created and attested, a leasing replica, and the usage report.
// It fails on any error, and on any release lost or script refused.
func exerciseFleet(url, prefix string) {
	ctx := context.Background()
	var logs bytes.Buffer
	open := func(fraction float64) (*redisstore.Store, *metrics.Metrics) {
		m := metrics.New(prometheus.NewRegistry())
		s, err := redisstore.New(redisstore.Options{URL: url, Prefix: prefix, LeaseFraction: fraction, Recorder: m,
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close() })
		return s, m
	}
	fleet, m := open(0)
	res, err := fleet.Reserve(ctx, everyDimension(1000))
	Expect(err).NotTo(HaveOccurred(), logs.String())
	Expect(res.Shared && res.Admitted).To(BeTrue())
	refused := everyDimension(1000)
	refused.Tokens[len(refused.Tokens)-1].SharedCapacity = 10
	res, err = fleet.Reserve(ctx, refused)
	Expect(err).NotTo(HaveOccurred())
	Expect(res.Admitted).To(BeFalse())
	Expect(releases(m, "lost")).To(BeZero(), "a release runs as the restricted user")
	fleet.Refund(ctx, budget.WithAmount(everyDimension(0).Tokens, 500))
	fleet.Charge(ctx, budget.WithAmount(everyDimension(0).Tokens, 100), budget.Debt)

	durable := &budget.Reservation{Tokens: []budget.Charge{{Key: budget.Key{Kind: budget.Calendar, Dim: budget.APIKey, ID: "x", Rule: "month", Start: 1},
		SharedCapacity: 10, Amount: 1, EndMillis: time.Now().Add(time.Hour).UnixMilli(), Durable: true}}}
	res, err = fleet.Reserve(ctx, durable)
	Expect(err).NotTo(HaveOccurred(), "the epoch is created (and stamped into every slot group): %s", logs.String())
	Expect(res.Admitted).To(BeTrue())
	_, err = fleet.Attest(ctx, durable.Tokens)
	Expect(err).NotTo(HaveOccurred(), "and attested")

	leasing, lm := open(0.01)
	res, err = leasing.Reserve(ctx, everyDimension(1000))
	Expect(err).NotTo(HaveOccurred())
	Expect(res.Admitted).To(BeTrue())
	Expect(testutil.ToFloat64(lm.RedisShared.Slices.WithLabelValues("global", "day", "leased"))).To(Equal(1.0), "a slice of the global day budget")
	Expect(leasing.Close()).To(Succeed())

	seen := map[budget.Dimension]bool{}
	Expect(fleet.EachLevel(ctx, func(k budget.Key, _, _ float64) { seen[k.Dim] = true })).To(Succeed(), "the usage report")
	Expect(seen).To(HaveLen(int(budget.NumDimensions)))
	Expect(logs.String()).NotTo(ContainSubstring("refused"))
	Expect(logs.String()).NotTo(ContainSubstring("unreachable"))
}

// fleetLevel reads a bucket of the fleet as the URL's (unrestricted) user.
func fleetLevel(url, prefix string, k budget.Key) float64 {
	admin, err := redisstore.New(redisstore.Options{URL: url, Prefix: prefix})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(admin.Close)
	l, ok, err := admin.Level(context.Background(), k)
	Expect(err).NotTo(HaveOccurred())
	Expect(ok).To(BeTrue())
	return l
}

var _ = Describe("A least-privilege Redis user", func() {
	ctx := context.Background()
	// The model day bucket (11.6 tokens a second): reserved twice (the leasing
	// replica's reservation in Redis too, the model budget's slice returned at close),
	// refunded 500, charged 100.
	day := everyDimension(0).Tokens[3]
	const want = 1000000 - 2000 + 500 - 100

	It("runs every budget operation on one server with the documented commands", func() {
		prefix := fmt.Sprintf("acl%d", prefixes.Add(1))
		user := "fleet-" + prefix
		restrictUser([]*redisserver.Server{srv}, user, "~{"+prefix+"}:*", userCommands)
		exerciseFleet("redis://"+user+":pw@"+srv.Addr()+"/0", prefix)
		Expect(fleetLevel(srv.URL(), prefix, day.Key)).To(BeNumerically("~", want, 50))
	})

	It("runs every budget operation on a cluster with the documented commands, and nothing else", func() {
		prefix := fmt.Sprintf("acl%d", prefixes.Add(1))
		user := "fleet-" + prefix
		restrictUser(cluster.Masters, user, "~{"+prefix+":*", append(clusterCommands, userCommands...))
		exerciseFleet(strings.Replace(cluster.URL(), "redis+cluster://", "redis+cluster://"+user+":pw@", 1), prefix)
		Expect(fleetLevel(cluster.URL(), prefix, day.Key)).To(BeNumerically("~", want, 50))

		// Without the slot map the client cannot start.
		bare := "bare-" + prefix
		restrictUser(cluster.Masters, bare, "~{"+prefix+":*", userCommands)
		s, err := redisstore.New(redisstore.Options{URL: strings.Replace(cluster.URL(), "redis+cluster://", "redis+cluster://"+bare+":pw@", 1),
			Prefix: prefix, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		_, err = s.Reserve(ctx, everyDimension(1))
		Expect(err).To(MatchError(ContainSubstring("cluster|slots")))

		// The user cannot flush a master or read another fleet's keys.
		c := redis.NewClient(&redis.Options{Addr: cluster.Masters[0].Addr(), Username: user, Password: "pw"})
		DeferCleanup(c.Close)
		Expect(c.FlushAll(ctx).Err()).To(MatchError(ContainSubstring("NOPERM")))
		Expect(c.Get(ctx, "{other}:global:").Err()).To(MatchError(ContainSubstring("NOPERM")))
	})

	It("runs every budget operation through Sentinel with the documented commands, on every data node, across a failover", func() {
		st := redisserver.StartSentinel(GinkgoT(), 1, 1)
		prefix := fmt.Sprintf("acl%d", prefixes.Add(1))
		user := "fleet-" + prefix
		restrictUser(st.Data, user, "~{"+prefix+"}:*", userCommands)
		url := strings.Replace(st.URL(), "redis+sentinel://", "redis+sentinel://"+user+":pw@", 1)
		exerciseFleet(url, prefix)
		Expect(fleetLevel(st.URL(), prefix, day.Key)).To(BeNumerically("~", want, 50))

		// The replica promoted by a failover knows the user too.
		s, err := redisstore.New(redisstore.Options{URL: url, Prefix: prefix,
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, Backoff: 50 * time.Millisecond})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		old := st.Primary(GinkgoT())
		Expect(old.Kill()).To(Succeed())
		st.WaitPrimary(GinkgoT(), old)
		Eventually(func() error {
			res, err := s.Reserve(ctx, everyDimension(1))
			if err == nil && !res.Shared {
				err = fmt.Errorf("admitted off Redis")
			}
			return err
		}).WithTimeout(10 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	})
})
