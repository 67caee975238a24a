// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

// tenantLoad counts one tenant's admissions: on Redis, on the fallback, refused by
// Redis, and errors.
type tenantLoad struct {
	shared, local, sharedRefused, errs atomic.Int64
	// longest is the longest any reservation took, in nanoseconds.
	longest atomic.Int64
}

// took keeps d if it is the longest a reservation took.
func (l *tenantLoad) took(d time.Duration) {
	for {
		prev := l.longest.Load()
		if int64(d) <= prev || l.longest.CompareAndSwap(prev, int64(d)) {
			return
		}
	}
}

// onMasters names the API keys of a and b so that a's slot group is on the cluster's
// first master and b's on its second.
func onMasters(own *redisserver.Cluster, s *redisstore.Store, a, b *budget.Charge) {
	for i := 0; a.Key.ID == "" || b.Key.ID == ""; i++ {
		id := fmt.Sprint("tenant-", i)
		switch own.MasterOf(GinkgoT(), s.Key(budget.Key{Dim: budget.APIKey, ID: id})) {
		case own.Masters[0]:
			a.Key.ID = id
		case own.Masters[1]:
			b.Key.ID = id
		}
	}
}

// loadTenants reserves each tenant's charge from four goroutines in a loop, counting
// each tenant's outcomes, until the returned stop is called (it waits for them).
func loadTenants(s *redisstore.Store, tenants [2]budget.Charge) (*[2]tenantLoad, func()) {
	var loads [2]tenantLoad
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			l, ch := &loads[w%2], tenants[w%2]
			for {
				select {
				case <-done:
					return
				default:
				}
				start := time.Now()
				res, err := s.Reserve(context.Background(), &budget.Reservation{Tokens: []budget.Charge{ch}})
				l.took(time.Since(start))
				switch {
				case err != nil:
					l.errs.Add(1)
				case res.Shared && res.Admitted:
					l.shared.Add(1)
				case res.Shared:
					l.sharedRefused.Add(1)
				case res.Admitted:
					l.local.Add(1)
				}
			}
		}()
	}
	var once sync.Once
	return &loads, func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}

var _ = Describe("Fallback per master on a cluster", func() {
	It("sends only the slot groups of a killed master to the fallback; the others stay on Redis, exact", func() {
		own := redisserver.StartCluster(GinkgoT(), 3, 0)
		fallback := budget.NewMemory(budget.SystemClock{}, 100)
		s := clusterStore(own.URL(), fallback)
		// Two tenants' API keys on different masters: the doomed one's is killed, the
		// other's bucket holds 300 tokens that never refill while the test runs.
		doomed, live := bucket(budget.APIKey, "", 1e6), bucket(budget.APIKey, "", 300)
		onMasters(own, s, &doomed, &live)
		loads, stop := loadTenants(s, [2]budget.Charge{doomed, live})
		defer stop()
		Eventually(loads[0].shared.Load).Should(BeNumerically(">", 20))
		Eventually(loads[1].shared.Load).Should(BeNumerically(">", 20))
		Expect(own.Masters[0].Kill()).To(Succeed())
		Eventually(loads[0].local.Load).WithTimeout(10*time.Second).Should(BeNumerically(">", 50), "the killed master's tenant falls back")
		Eventually(loads[1].sharedRefused.Load).WithTimeout(10*time.Second).Should(BeNumerically(">", 50), "the live tenant spends its bucket on Redis")
		// The killed master comes back (empty, with its slots): its tenant returns to
		// Redis after the backoff.
		Expect(own.Masters[0].Restart()).To(Succeed())
		own.WaitOK(GinkgoT())
		sharedBefore := loads[0].shared.Load()
		Eventually(loads[0].shared.Load).WithTimeout(10*time.Second).Should(BeNumerically(">", sharedBefore+20), "back on Redis")
		stop()
		GinkgoWriter.Printf("killed master's tenant: %d on Redis, %d on the fallback; live tenant: %d on Redis, %d refused, %d on the fallback\n",
			loads[0].shared.Load(), loads[0].local.Load(), loads[1].shared.Load(), loads[1].sharedRefused.Load(), loads[1].local.Load())
		Expect(loads[0].errs.Load()+loads[1].errs.Load()).To(BeZero(), "every admission was answered")
		Expect(loads[1].local.Load()).To(BeZero(), "the live master's groups never fell back")
		Expect(loads[1].shared.Load()).To(BeEquivalentTo(300), "the live tenant's bucket admitted its 300, exactly")
	})
})
