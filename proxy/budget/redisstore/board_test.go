// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"context"
	"log/slog"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/health"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("The board's billing cooldowns when Redis refuses a write", func() {
	const cred = "sk-upstream"
	var (
		ctx   context.Context
		admin *redis.Client
		a, b  *health.Registry
	)
	// replica is one more proxy's registry, sharing its cooldowns on rs.
	replica := func(rs *redisserver.Server) *health.Registry {
		log := slog.New(slog.NewTextHandler(GinkgoWriter, nil))
		store, err := redisstore.New(redisstore.Options{URL: rs.URL(), Prefix: "board", Logger: log})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(store.Close)
		r := health.NewRegistry()
		r.Share(store.Board(), log)
		return r
	}
	// refuseWrites has Redis refuse every write (out of memory) until the returned
	// function lets it take them again.
	refuseWrites := func() func() {
		Expect(admin.ConfigSet(ctx, "maxmemory", "1").Err()).To(Succeed())
		return func() { Expect(admin.ConfigSet(ctx, "maxmemory", "0").Err()).To(Succeed()) }
	}
	// outOnB is whether replica b, synced with the board, keeps the credential out.
	outOnB := func() bool {
		Expect(b.Sync(ctx, []string{cred})).To(Succeed())
		return b.Cooldown(cred).Out(time.Now())
	}
	bill := func() health.Cooling {
		now := time.Now()
		return health.Cooling{Since: now, Until: now.Add(time.Minute), Applied: time.Minute, Upstream: "primary", Code: "insufficient_quota"}
	}

	BeforeEach(func() {
		ctx = context.Background()
		rs := redisserver.Start(GinkgoT())
		admin = rs.Client()
		DeferCleanup(admin.Close)
		a, b = replica(rs), replica(rs)
	})

	It("clears the cooldown on the other replicas once Redis takes the clear it refused", func() {
		a.Cooldown(cred).Bill(bill())
		Expect(outOnB()).To(BeTrue(), "b learned the billing cooldown")

		writable := refuseWrites()
		Expect(a.Cooldown(cred).Clear(time.Now())).To(BeTrue(), "a's probe found the account answering")
		Expect(outOnB()).To(BeTrue(), "the clear did not reach Redis")
		writable()

		Eventually(outOnB).WithTimeout(10*time.Second).WithPolling(100*time.Millisecond).
			Should(BeFalse(), "the clear is sent again until it lands, and b serves the credential")
		Consistently(outOnB).WithTimeout(1500 * time.Millisecond).Should(BeFalse())
	})

	It("never lands a refused cooldown over the clear written after it", func() {
		writable := refuseWrites()
		a.Cooldown(cred).Bill(bill())
		writable()
		Expect(a.Cooldown(cred).Clear(time.Now())).To(BeTrue())
		// The refused cooldown's resend comes after a second: the clear stays.
		Consistently(outOnB).WithTimeout(2500 * time.Millisecond).Should(BeFalse())
	})
})
