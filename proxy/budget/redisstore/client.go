// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
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
//
// Two things in the client would make one call cost several timeouts. A cluster
// client follows up to MaxRedirects redirections and spends the same attempts
// re-sending a call whose connection failed (a timeout, a reset, a dial), whatever
// MaxRetries says (it reaches only the clients of the nodes): its nodes carry the
// noResend hook, which lets a redirection through and nothing else. And every client
// keeps a second pool for pipelines, and when that pool's new connection cannot be
// set up (a stalled server accepts and never answers its HELLO) it sets up another
// in the main pool before sending: pipelines run on the main pool (PipelinePoolSize
// -1), with the pipeline pool's write buffer, so a pipeline still goes in one write.
func newClient(o *Options) (c redis.UniversalClient, sharded bool, err error) {
	return newClientAs(o, "", o.Password)
}

// newClientAs is newClient authenticating as user with password when user is set (the
// check credential), else as the URL's user with password when it is set.
func newClientAs(o *Options, user, password string) (c redis.UniversalClient, sharded bool, err error) {
	t, err := config.ParseRedisURL(o.URL)
	if err != nil {
		return nil, false, err
	}
	if user != "" {
		t.Username, t.Password = user, password
	} else if password != "" {
		t.Password = password
	}
	var tlsConfig *tls.Config
	if t.TLS {
		host, _, _ := net.SplitHostPort(t.Addrs[0])
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	}
	switch t.Mode {
	case config.RedisCluster:
		cc := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: t.Addrs, Username: t.Username, Password: t.Password, TLSConfig: tlsConfig,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolTimeout: o.DialTimeout + o.ReadTimeout, ContextTimeoutEnabled: true,
			MaxRetries: -1, MaxRedirects: maxRedirects, DialerRetries: 1,
			// A redirection is sent on at once; a call that failed is not sent again
			// (noResend), so it waits for no backoff either.
			MinRetryBackoff:  -1,
			PipelinePoolSize: -1, WriteBufferSize: redis.DefaultPipelineBufferSize,
		})
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(noResend{}) })
		return cc, true, nil
	case config.RedisSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: t.MasterName, SentinelAddrs: t.Addrs, SentinelPassword: o.SentinelPassword,
			Username: t.Username, Password: t.Password, DB: t.DB, TLSConfig: tlsConfig,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolTimeout: o.DialTimeout + o.ReadTimeout, ContextTimeoutEnabled: true,
			MaxRetries: -1, DialerRetries: 1,
			PipelinePoolSize: -1, WriteBufferSize: redis.DefaultPipelineBufferSize,
		}), false, nil
	}
	opts, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, false, err
	}
	opts.Username, opts.Password = t.Username, t.Password
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = o.DialTimeout, o.ReadTimeout, o.WriteTimeout
	opts.PoolTimeout = o.DialTimeout + o.ReadTimeout
	// A retry multiplies the cost of an outage; the fallback is the retry.
	opts.MaxRetries = -1
	opts.DialerRetries = 1
	opts.ContextTimeoutEnabled = true
	opts.PipelinePoolSize, opts.WriteBufferSize = -1, redis.DefaultPipelineBufferSize
	return redis.NewClient(opts), false, nil
}

// noResend keeps a cluster node's client from sending again a call that failed on
// its connection: the cluster client sends a call once more when its first attempt
// fails, on the same node and then on the slot's master found again, and each
// attempt waits for its own timeout. A call that failed that way carries the error
// of its first attempt, which noResend returns at once. A call that carries a Redis
// error (a MOVED or ASK redirection, TRYAGAIN, CLUSTERDOWN) was not run, and goes.
type noResend struct{}

// DialHook implements redis.Hook.
func (noResend) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (noResend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := cmd.Err(); failedOnConn(err) {
			return err
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (noResend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if err := cmd.Err(); failedOnConn(err) {
				return err
			}
		}
		return next(ctx, cmds)
	}
}

// failedOnConn tells whether err is a call's failure to get an answer (a timeout, a
// connection refused or reset) rather than Redis' answer.
func failedOnConn(err error) bool {
	var answered redis.Error
	return err != nil && !errors.As(err, &answered)
}
