// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"crypto/tls"
	"net"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// maxRedirects is how many MOVED or ASK redirections a cluster call follows: a slot
// migrating while a call is sent costs one more hop, not an error.
const maxRedirects = 3

// newClient builds the client the URL names: one server, a Redis Cluster (sharded:
// keys hash-tagged by slot group), or the primary Sentinel names (one server at a
// time, found again after a failover). Every call is bounded by the timeouts and never
// retried: the fallback is the retry.
func newClient(o *Options) (c redis.UniversalClient, sharded bool, err error) {
	t, err := config.ParseRedisURL(o.URL)
	if err != nil {
		return nil, false, err
	}
	if o.Password != "" {
		t.Password = o.Password
	}
	var tlsConfig *tls.Config
	if t.TLS {
		host, _, _ := net.SplitHostPort(t.Addrs[0])
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	}
	switch t.Mode {
	case config.RedisCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: t.Addrs, Username: t.Username, Password: t.Password, TLSConfig: tlsConfig,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolTimeout: o.DialTimeout + o.ReadTimeout, ContextTimeoutEnabled: true,
			MaxRetries: -1, MaxRedirects: maxRedirects, DialerRetries: 1,
		}), true, nil
	case config.RedisSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: t.MasterName, SentinelAddrs: t.Addrs, SentinelPassword: o.SentinelPassword,
			Username: t.Username, Password: t.Password, DB: t.DB, TLSConfig: tlsConfig,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolTimeout: o.DialTimeout + o.ReadTimeout, ContextTimeoutEnabled: true,
			MaxRetries: -1, DialerRetries: 1,
		}), false, nil
	}
	opts, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, false, err
	}
	if o.Password != "" {
		opts.Password = o.Password
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = o.DialTimeout, o.ReadTimeout, o.WriteTimeout
	opts.PoolTimeout = o.DialTimeout + o.ReadTimeout
	// A retry multiplies the cost of an outage; the fallback is the retry.
	opts.MaxRetries = -1
	opts.DialerRetries = 1
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(opts), false, nil
}
