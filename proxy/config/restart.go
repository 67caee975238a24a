// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import "reflect"

// RestartRequired lists the fields of next that differ from started, the document a
// process started with, and that the process applies only when it starts: the
// addresses it listens on, the budget store it built (which store, and how it reaches
// Redis), tracing, the access log's buffer, and the ledger. Every other field,
// rate_limiting.redis.fallback_to_memory and rate_limiting.redis.checks included, a
// reload applies at once. The redis fields count only when either document stores
// budgets in Redis.
func RestartRequired(started, next *Config) []string {
	out := []string{}
	diff := func(field string, changed bool) {
		if changed {
			out = append(out, field)
		}
	}
	diff("listen", started.Listen != next.Listen)
	diff("admin_listen", started.AdminListen != next.AdminListen)
	diff("observability.tracing", !started.Observability.Tracing.Same(&next.Observability.Tracing))
	diff("observability.access_log.buffer_lines", started.Observability.AccessLog.Buffer() != next.Observability.AccessLog.Buffer())
	diff("ledger", started.Ledger != next.Ledger)
	a, b := &started.RateLimiting, &next.RateLimiting
	diff("rate_limiting.storage", a.Storage != b.Storage)
	if a.Storage == StorageRedis || b.Storage == StorageRedis {
		diff("rate_limiting.redis.url", a.Redis.URL != b.Redis.URL)
		diff("rate_limiting.redis.password_env", a.Redis.PasswordEnv != b.Redis.PasswordEnv)
		diff("rate_limiting.redis.sentinel_password_env", a.Redis.SentinelPasswordEnv != b.Redis.SentinelPasswordEnv)
		diff("rate_limiting.redis.hot_budget_slice", a.Redis.HotBudgetSlice != b.Redis.HotBudgetSlice)
		diff("rate_limiting.redis.ledger_fallback", !reflect.DeepEqual(a.Redis.LedgerFallback, b.Redis.LedgerFallback))
		diff("rate_limiting.redis.key_prefix", a.Redis.KeyPrefix != b.Redis.KeyPrefix)
		diff("rate_limiting.redis.dial_timeout_ms", a.Redis.DialTimeoutMillis != b.Redis.DialTimeoutMillis)
		diff("rate_limiting.redis.read_timeout_ms", a.Redis.ReadTimeoutMillis != b.Redis.ReadTimeoutMillis)
		diff("rate_limiting.redis.write_timeout_ms", a.Redis.WriteTimeoutMillis != b.Redis.WriteTimeoutMillis)
	}
	return out
}

// RestartBasis is what RestartRequired reads of the document a process started with:
// a copy of c without its keys, rules and per_model limits, which are most of a large
// fleet's document and which every reload applies. A process keeps it for as long as
// it runs, beside the config in force: with the whole document it kept a second copy
// of every key.
func RestartBasis(c *Config) *Config {
	if c == nil {
		return nil
	}
	b := *c
	b.APIKeys, b.RateLimiting.Rules, b.RateLimiting.Limits.PerModel = nil, nil, nil
	return &b
}
