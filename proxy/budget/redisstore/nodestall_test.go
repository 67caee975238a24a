// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"fmt"
	"log/slog"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
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

var _ = Describe("A master stalled for five seconds", func() {
	It("costs the requests of its slot groups one timeout, then the fallback, counted and logged; the other masters' are not delayed", func() {
		// The timeouts a proxy would run with, long enough that a loaded machine cannot
		// blur one timeout with two.
		const timeout = time.Second
		own := redisserver.StartCluster(GinkgoT(), 3, 0)
		m := metrics.New(prometheus.NewRegistry())
		logs := gbytes.NewBuffer()
		s, err := redisstore.New(redisstore.Options{
			URL: own.URL(), Prefix: fmt.Sprintf("c%d", prefixes.Add(1)),
			DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
			Fallback: budget.NewMemory(budget.SystemClock{}, 100), Recorder: m,
			Logger: slog.New(slog.NewTextHandler(logs, nil)),
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		stalled, live := bucket(budget.APIKey, "", 1e9), bucket(budget.APIKey, "", 1e9)
		onMasters(own, s, &stalled, &live)

		loads, stop := loadTenants(s, [2]budget.Charge{stalled, live})
		defer stop()
		Eventually(loads[0].shared.Load).Should(BeNumerically(">", 20))
		Eventually(loads[1].shared.Load).Should(BeNumerically(">", 20))

		Expect(own.Masters[0].Pause()).To(Succeed())
		DeferCleanup(own.Masters[0].Resume)
		sharedAtPause := loads[0].shared.Load()
		time.Sleep(5 * time.Second) // the stall
		sharedInStall := loads[0].shared.Load() - sharedAtPause
		Expect(own.Masters[0].Resume()).To(Succeed())
		Eventually(loads[0].shared.Load).WithTimeout(10*time.Second).Should(BeNumerically(">", sharedAtPause+sharedInStall+20), "back on Redis")
		stop()

		unavailable := testutil.ToFloat64(m.RedisUnavailableVec.WithLabelValues("api_key", "fallback_memory"))
		GinkgoWriter.Printf("stalled master's tenant: longest reservation %v, %d on the fallback, %d on Redis during the stall; "+
			"live tenant: longest %v, %d on the fallback; unavailable counted %v\n",
			time.Duration(loads[0].longest.Load()), loads[0].local.Load(), sharedInStall,
			time.Duration(loads[1].longest.Load()), loads[1].local.Load(), unavailable)
		Expect(loads[0].errs.Load()+loads[1].errs.Load()).To(BeZero(), "every admission was answered")
		Expect(time.Duration(loads[0].longest.Load())).To(BeNumerically("<", 2*timeout),
			"a reservation on the stalled master waits one timeout, not the stall")
		Expect(loads[0].local.Load()).To(BeNumerically(">", 50), "the stalled master's tenant is admitted on the fallback")
		Expect(unavailable).To(BeNumerically(">=", float64(loads[0].local.Load())), "each fallback admission is counted")
		Expect(logs).To(gbytes.Say("A Redis Cluster master is unreachable"))
		Expect(loads[1].local.Load()).To(BeZero(), "the live master's tenant never fell back")
		Expect(time.Duration(loads[1].longest.Load())).To(BeNumerically("<", timeout), "the live master's tenant never waited for a timeout")
	})
})
