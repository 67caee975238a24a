// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("A stalled master on a cluster", func() {
	It("does not slow the admissions of the other masters' slot groups", func() {
		own := redisserver.StartCluster(GinkgoT(), 3, 0)
		fallback := budget.NewMemory(budget.SystemClock{}, 100)
		s := clusterStore(own.URL(), fallback)
		// Two tenants' API keys on different masters, with budgets that do not run out:
		// the stalled one's master is paused (SIGSTOP: its connections stay open and
		// nothing answers), the live one's keeps answering.
		stalled, live := bucket(budget.APIKey, "", 1e9), bucket(budget.APIKey, "", 1e9)
		onMasters(own, s, &stalled, &live)
		loads, stop := loadTenants(s, [2]budget.Charge{stalled, live})
		defer stop()
		// liveRate is how many admissions a second the live tenant gets on Redis while
		// it gains n more.
		liveRate := func(n int64) float64 {
			start, from := time.Now(), loads[1].shared.Load()
			Eventually(loads[1].shared.Load).WithTimeout(20*time.Second).WithPolling(time.Millisecond).
				Should(BeNumerically(">=", from+n), "the live tenant is admitted on Redis")
			return float64(loads[1].shared.Load()-from) / time.Since(start).Seconds()
		}
		Eventually(loads[0].shared.Load).Should(BeNumerically(">", 20))
		Eventually(loads[1].shared.Load).Should(BeNumerically(">", 20))
		unpaused := liveRate(5000)

		Expect(own.Masters[0].Pause()).To(Succeed())
		DeferCleanup(own.Masters[0].Resume)
		// From the moment of the pause: through the first calls that wait for the
		// stalled master, its marking down, and the probes after each backoff (50ms).
		paused := liveRate(5000)
		Eventually(loads[0].local.Load).WithTimeout(10*time.Second).Should(BeNumerically(">", 50), "the stalled master's tenant falls back")
		pausedLater := liveRate(5000)
		GinkgoWriter.Printf("live tenant on Redis: %.0f admissions/s unpaused, %.0f and %.0f with the other master paused; stalled tenant: %d on the fallback\n",
			unpaused, paused, pausedLater, loads[0].local.Load())
		Expect(paused).To(BeNumerically(">", unpaused/4), "admitted on Redis at the rate it had, within a factor")
		Expect(pausedLater).To(BeNumerically(">", unpaused/4), "admitted on Redis at the rate it had, within a factor")
		Expect(loads[1].local.Load()+loads[1].errs.Load()).To(BeZero(), "the live master's groups never fell back")
	})
})
