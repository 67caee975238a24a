// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("Fallback per master on a cluster that names its masters by hostname", func() {
	It("skips a stalled master after its first failure, though the connection error names its IP address", func() {
		own := redisserver.StartCluster(GinkgoT(), 3, 0)
		ctx := context.Background()
		for _, m := range own.Masters {
			Expect(m.Client().ConfigSet(ctx, "cluster-announce-hostname", "localhost").Err()).To(Succeed())
			Expect(m.Client().ConfigSet(ctx, "cluster-preferred-endpoint-type", "hostname").Err()).To(Succeed())
		}
		// Every master's slot map names every master by hostname.
		Eventually(func(g Gomega) {
			for _, m := range own.Masters {
				shards, err := m.Client().ClusterShards(ctx).Result()
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(shards).To(HaveLen(len(own.Masters)))
				for _, sh := range shards {
					for _, n := range sh.Nodes {
						g.Expect(n.Endpoint).To(Equal("localhost"))
					}
				}
			}
		}).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(Succeed())

		// Fail closed, and a backoff that outlasts the test: a reservation on the stalled
		// master's slot group after its first failure is refused without a call.
		s, err := redisstore.New(redisstore.Options{
			URL: own.URL(), Prefix: fmt.Sprint("h", GinkgoParallelProcess()),
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
			Backoff: time.Hour,
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		doomed := bucket(budget.APIKey, "", 1e6)
		for i := 0; doomed.Key.ID == ""; i++ {
			id := fmt.Sprint("tenant-", i)
			if own.MasterOf(GinkgoT(), s.Key(budget.Key{Dim: budget.APIKey, ID: id})) == own.Masters[0] {
				doomed.Key.ID = id
			}
		}
		reserve := func() error {
			_, err := s.Reserve(ctx, &budget.Reservation{Tokens: []budget.Charge{doomed}})
			return err
		}
		Expect(reserve()).To(Succeed())

		Expect(own.Masters[0].Pause()).To(Succeed())
		DeferCleanup(own.Masters[0].Resume)
		err = reserve()
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("timeout"), "the first call waits for the stalled master")
		err = reserve()
		Expect(err).To(HaveOccurred())
		Expect(strings.Contains(err.Error(), "marked down after a recent failure")).To(BeTrue(),
			"the next one is not sent: %v", err)
	})
})
