// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("Redis URLs", func() {
	DescribeTable("name one server, a cluster or a Sentinel primary",
		func(raw string, want config.RedisTarget) {
			got, err := config.ParseRedisURL(raw)
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(Equal(want))
		},
		Entry("one server", "redis://u:p@h:6380/2",
			config.RedisTarget{Mode: config.RedisSingle, Addrs: []string{"h:6380"}, DB: 2, Username: "u", Password: "p"}),
		Entry("one server over TLS, default port", "rediss://h",
			config.RedisTarget{Mode: config.RedisSingle, Addrs: []string{"h:6379"}, TLS: true}),
		Entry("a cluster's seeds", "redis+cluster://:secret@a:7000,b:7001,c",
			config.RedisTarget{Mode: config.RedisCluster, Addrs: []string{"a:7000", "b:7001", "c:6379"}, Password: "secret"}),
		Entry("a cluster's seeds in addr parameters", "rediss+cluster://a:7000?addr=b:7001&addr=c",
			config.RedisTarget{Mode: config.RedisCluster, Addrs: []string{"a:7000", "b:7001", "c:6379"}, TLS: true}),
		Entry("a Sentinel primary", "redis+sentinel://s1,s2:26380/mymaster/1",
			config.RedisTarget{Mode: config.RedisSentinel, Addrs: []string{"s1:26379", "s2:26380"}, MasterName: "mymaster", DB: 1}),
	)
})
