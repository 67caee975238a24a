// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package budget_test

import (
	"context"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/storetest"
)

// told is a SettleReceiver that passes each settlement on.
type told chan budget.Settlement

func (t told) Settled(s budget.Settlement) { t <- s }

var _ = Describe("A settlement", func() {
	ctx := context.Background()

	DescribeTable("tells the most tokens a bucket went into debt for",
		func(overage string, async bool, debt float64) {
			p := policy(`  overage: ` + overage + `
  limits:
    global: {tokens_per_minute: 60000}
    per_api_key: {tokens_per_minute: 600, tokens_per_day: 1000}
`)
			clock := storetest.NewClock()
			l := budget.NewLimiter(budget.NewMemory(clock, 100), budget.NopRecorder{}, clock, async)
			dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: 500})
			Expect(err).NotTo(HaveOccurred())
			// 500 reserved, 1,400 used: global holds the 900 more; the key's minute bucket
			// (100 left) goes to -600, its bound, and its day bucket (500 left) to -400.
			to := make(told, 1)
			Expect(dec.Hold.SettleTo(budget.Used{Input: 1400}, to)).To(BeTrue())
			Eventually(to).Should(Receive(Equal(budget.Settlement{Debt: debt})))
			Expect(dec.Hold.SettleTo(budget.Used{Input: 1400}, to)).To(BeFalse(), "a hold settles once")
			Consistently(to).ShouldNot(Receive())
		},
		Entry("under debt", "debt", false, 600.0),
		Entry("under debt, settled off the request's goroutine", "debt", true, 600.0),
		Entry("under forgive", "forgive", false, 0.0),
	)

	Describe("on a store that sends refunds without waiting", func() {
		p := policy(`  limits:
    per_api_key: {tokens_per_minute: 6000, tokens_per_day: 100000}
`)
		var (
			clock *storetest.Clock
			store *sendingStore
			l     *budget.Limiter
		)
		BeforeEach(func() {
			clock = storetest.NewClock()
			store = &sendingStore{Memory: budget.NewMemory(clock, 100), sent: make(chan func(), 10)}
			l = budget.NewLimiter(store, budget.NopRecorder{}, clock, true)
		})
		admit := func(input int64) *budget.Hold {
			dec, err := l.Admit(ctx, p, budget.Identity{Key: p.Key("alice")}, budget.Ask{Input: input})
			Expect(err).NotTo(HaveOccurred())
			Expect(dec.Refusal).To(BeNil())
			Expect(dec.Hold).NotTo(BeNil())
			return dec.Hold
		}
		// waits reports whether the limiter still waits for a settlement.
		waits := func() bool {
			short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			return l.Wait(short) != nil
		}

		It("refunds on the request's goroutine, and a stopping proxy waits until the refund is applied", func() {
			h := admit(1000)
			to := make(told, 1)
			Expect(h.SettleTo(budget.Used{Input: 400}, to)).To(BeTrue())
			// Told before SettleTo returned: no goroutine of its own.
			Expect(to).To(Receive(Equal(budget.Settlement{})))
			Expect(store.sent).To(HaveLen(1), "the refund was sent")
			Expect(waits()).To(BeTrue(), "pending until the store applies it")
			(<-store.sent)()
			Expect(waits()).To(BeFalse())
			Expect(store.refunded).To(Equal(2*600.0), "each bucket got back what was not used")
		})

		It("releases on the request's goroutine the same way", func() {
			h := admit(1000)
			Expect(h.Release()).To(BeTrue())
			Expect(store.sent).To(HaveLen(1))
			Expect(waits()).To(BeTrue())
			(<-store.sent)()
			Expect(waits()).To(BeFalse())
			Expect(store.refunded).To(Equal(2 * 1000.0))
		})

		It("charges an overage off the request's goroutine, which waits for the store's answer", func() {
			h := admit(1000)
			to := make(told, 1)
			Expect(h.SettleTo(budget.Used{Input: 1500}, to)).To(BeTrue())
			Eventually(to).Should(Receive(Equal(budget.Settlement{})))
			Expect(store.sent).To(BeEmpty(), "nothing to refund")
			Expect(waits()).To(BeFalse())
		})
	})
})

// sendingStore is a memory store that sends refunds the way the Redis store does:
// each is applied later, when the test runs what it sent, and its wait group is done
// then.
type sendingStore struct {
	*budget.Memory
	sent     chan func()
	mu       sync.Mutex
	refunded float64
}

func (s *sendingStore) SendRefund(charges []budget.Charge, wg *sync.WaitGroup) {
	wg.Add(1)
	kept := slices.Clone(charges) // the charges are lent: nothing keeps them
	s.sent <- func() {
		s.Refund(context.Background(), kept)
		s.mu.Lock()
		for _, ch := range kept {
			s.refunded += ch.Amount
		}
		s.mu.Unlock()
		wg.Done()
	}
}

// Reserve holds the reservation in the sending store, as the Redis store holds its own.
func (s *sendingStore) Reserve(ctx context.Context, r *budget.Reservation) (budget.Result, error) {
	res, err := s.Memory.Reserve(ctx, r)
	if res.Backend == budget.Store(s.Memory) {
		res.Backend = s
	}
	return res, err
}
