// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// NewRedisClient is the cache's own client of the Redis url names (one server, a
// cluster or a Sentinel primary, as the counters' URLs are written), with password
// in place of the URL's when set. Each call is bounded by timeout, dial included, and
// never retried: a slow cache is a miss, not a wait.
func NewRedisClient(url, password string, timeout time.Duration) (redis.UniversalClient, error) {
	t, err := config.ParseRedisURL(url)
	if err != nil {
		return nil, fmt.Errorf("the cache's Redis URL: %w", err)
	}
	if password != "" {
		t.Password = password
	}
	o := &redis.UniversalOptions{
		Addrs: t.Addrs, DB: t.DB, Username: t.Username, Password: t.Password,
		MasterName: t.MasterName, IsClusterMode: t.Mode == config.RedisCluster,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout,
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
	}
	if t.TLS {
		host, _, _ := net.SplitHostPort(t.Addrs[0])
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	}
	return redis.NewUniversalClient(o), nil
}
