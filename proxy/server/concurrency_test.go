// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

var _ = Describe("Concurrency", func() {
	It("never admits more than the budget, however many requests arrive at once", func() {
		h := newHarness(keysDoc + `
  max_buckets: 1000
  limits:
    per_team: {tokens_per_minute: 1080}
`)
		// Each request reserves 108 tokens and holds them for the backend's latency, so
		// at most ten fit; the clock does not move, so nothing refills.
		h.llm.Set(fakellm.Behaviour{InputTokens: 100, OutputTokens: 8, Latency: 3 * time.Second})
		var ok, refused atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 500; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				defer GinkgoRecover()
				key := "sk-alice"
				if i%2 == 1 {
					key = "sk-bob"
				}
				switch code := h.chat(key, 108-chatInput).code; code {
				case 200:
					ok.Add(1)
				case 429:
					refused.Add(1)
				default:
					Fail("unexpected status")
				}
			}(i)
		}
		wg.Wait()
		Expect(ok.Load()).To(Equal(int64(10)))
		Expect(refused.Load()).To(Equal(int64(490)))
		Expect(h.level(budget.TokensMinute, budget.Team, "research", 1080)).To(BeNumerically("~", 0, 0.01))
	})
})
