// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("A fleet on a Redis Cluster", func() {
	It("enforces one total across two proxies, on buckets spread over the masters", func() {
		cluster := redisserver.StartCluster(GinkgoT(), 3, 0)
		h := newHarness(keysDoc)
		prefix := fmt.Sprintf("fleet%d", redisPrefixes.Add(1))
		// The team's budget decides; the global and per-user ones, in other slot
		// groups, are reserved and settled with it.
		doc := redisDoc(cluster.URL(), true, "1080") + "    global: {tokens_per_minute: 1000000}\n    per_user: {tokens_per_minute: 1000000}\n"
		a := via(h, newRedisProxy(h, cluster.URL(), prefix, true, doc).url)
		b := via(h, newRedisProxy(h, cluster.URL(), prefix, true, doc).url)
		h.llm.Set(fakellmUsage(100, 8)) // each request settles at 108 of its 108
		for i := 0; i < 10; i++ {
			send := a
			if i%2 == 1 {
				send = b
			}
			Expect(send("sk-alice", 108-chatInput).code).To(Equal(200), "request %d of 10 fits the fleet total of 1080", i)
		}
		Expect(a("sk-bob", 100).code).To(Equal(429), "the 11th request, on either proxy, does not fit")
		Expect(b("sk-bob", 100).code).To(Equal(429))
	})
})
