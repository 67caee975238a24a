// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// FieldError is one invalid field, named by its path in the document.
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

type fieldErrors []error

func (es *fieldErrors) add(field, format string, args ...any) {
	*es = append(*es, &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
}

// validName reports whether s is a name: 1 to 253 letters, digits, '.', '_' and '-',
// beginning and ending with a letter or digit. (Checked by hand rather than by a
// regular expression: a large fleet's document has 50,000 of them.)
func validName(s string) bool {
	if len(s) == 0 || len(s) > 253 || !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; !alnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func hexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func alnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// sha256Hex reports whether s is the 64 hex digits of a SHA-256, in either case.
func sha256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := range len(s) {
		if !hexDigit(s[i]) {
			return false
		}
	}
	return true
}

// Validate checks every field and returns all problems at once, each naming its field.
func (c *Config) Validate() error {
	var errs fieldErrors
	checkAddr(&errs, "listen", c.Listen)
	checkAddr(&errs, "admin_listen", c.AdminListen)
	if c.MaxBodyBytes < 0 {
		errs.add("max_body_bytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	c.validateUpstreams(&errs)
	switch c.Auth.Mode {
	case AuthRequired, AuthOptional:
	default:
		errs.add("auth.mode", "must be %q or %q, got %q", AuthRequired, AuthOptional, c.Auth.Mode)
	}
	for i, p := range c.Auth.TrustedProxies {
		if _, err := ParsePrefix(p); err != nil {
			errs.add(fmt.Sprintf("auth.trusted_proxies[%d]", i), "%v", err)
		}
	}
	c.validateModels(&errs)
	c.validateRegistry(&errs)
	c.validateRouting(&errs)
	c.validateKeys(&errs)
	c.validateRateLimiting(&errs)
	c.validateRules(&errs)
	c.validateScheduling(&errs)
	c.validateAgents(&errs)
	c.validateObservability(&errs)
	c.validateLedger(&errs)
	c.validateCache(&errs)
	return errors.Join(errs...)
}

func checkAddr(errs *fieldErrors, field, addr string) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		errs.add(field, "must be host:port, got %q", addr)
	}
}

func (c *Config) validateUpstreams(errs *fieldErrors) {
	if len(c.Upstreams) == 0 {
		errs.add("upstreams", "at least one upstream is required")
	}
	names := map[string]int{}
	servedBy := map[string]int{}
	for i, u := range c.Upstreams {
		f := fmt.Sprintf("upstreams[%d]", i)
		if !validName(u.Name) {
			errs.add(f+".name", "must be a non-empty name of letters, digits, '.', '_' and '-', got %q", u.Name)
		} else if j, dup := names[u.Name]; dup {
			errs.add(f+".name", "%q is also the name of upstreams[%d]", u.Name, j)
		}
		names[u.Name] = i
		if err := checkUpstreamURL(u.URL); err != nil {
			errs.add(f+".url", "%v", err)
		}
		for k, m := range u.Models {
			if m == "" {
				errs.add(fmt.Sprintf("%s.models[%d]", f, k), "must not be empty")
				continue
			}
			if j, dup := servedBy[m]; dup {
				errs.add(fmt.Sprintf("%s.models[%d]", f, k), "model %q is also listed by upstreams[%d]; the first match would always win", m, j)
				continue
			}
			servedBy[m] = i
		}
		if u.TimeoutSeconds < 0 {
			errs.add(f+".timeout_seconds", "must not be negative, got %d", u.TimeoutSeconds)
		}
		if c := u.Capacity; c != nil {
			nonNegative(errs, f+".capacity.max_in_flight_requests", c.MaxInFlightRequests)
			nonNegative(errs, f+".capacity.max_in_flight_tokens", c.MaxInFlightTokens)
			validateLearn(errs, f+".capacity", c)
		}
	}
}

func checkUpstreamURL(raw string) error {
	if !strings.Contains(raw, "://") {
		return fmt.Errorf("must be an http:// or https:// URL, got %q", raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("must be an http:// or https:// URL, got %q", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("must name a host, got %q", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("must not carry a query or fragment, got %q", raw)
	}
	return nil
}

func (c *Config) validateKeys(errs *fieldErrors) {
	names := make(map[string]int, len(c.APIKeys))
	hashes := make(map[string]int, len(c.APIKeys))
	for i := range c.APIKeys {
		k := &c.APIKeys[i]
		// The field's name is only made for an error: a large fleet has 50,000 keys.
		f := func(sub string) string { return "api_keys[" + strconv.Itoa(i) + "]" + sub }
		if !validName(k.Name) {
			errs.add(f(".name"), "must be a non-empty name of letters, digits, '.', '_' and '-', got %q", k.Name)
		} else if j, dup := names[k.Name]; dup {
			errs.add(f(".name"), "%q is also the name of api_keys[%d]", k.Name, j)
		}
		names[k.Name] = i
		if !sha256Hex(k.KeySHA256) {
			errs.add(f(".key_sha256"), "must be the 64 hex digits of the key's SHA-256")
		} else {
			k.KeySHA256 = strings.ToLower(k.KeySHA256)
			if j, dup := hashes[k.KeySHA256]; dup {
				errs.add(f(".key_sha256"), "the same key as api_keys[%d]", j)
			}
			hashes[k.KeySHA256] = i
		}
		if k.Tenant != "" && !tenantNameRE.MatchString(k.Tenant) {
			errs.add(f(".tenant"), "must be a tenant's name of lowercase letters, digits and '-', got %q", k.Tenant)
		}
		switch k.Priority {
		case "", PriorityInteractive, PriorityBatch, PriorityBackground:
		default:
			errs.add(f(".priority"), "must be %q, %q or %q, got %q", PriorityInteractive, PriorityBatch, PriorityBackground, k.Priority)
		}
		if k.Weight < 0 || math.IsNaN(k.Weight) || math.IsInf(k.Weight, 0) {
			errs.add(f(".weight"), "must be a positive number, got %v", k.Weight)
		}
		if k.RateLimit < 0 || k.RateLimitBurst < 0 || k.RateLimitTokensPerMinute < 0 || k.RateLimitTokensPerDay < 0 {
			nonNegative(errs, f(".rate_limit"), k.RateLimit)
			nonNegative(errs, f(".rate_limit_burst"), k.RateLimitBurst)
			nonNegative(errs, f(".rate_limit_tokens_per_minute"), k.RateLimitTokensPerMinute)
			nonNegative(errs, f(".rate_limit_tokens_per_day"), k.RateLimitTokensPerDay)
		}
	}
}

func nonNegative(errs *fieldErrors, field string, v int64) {
	if v < 0 {
		errs.add(field, "must not be negative, got %d", v)
	}
}

func (c *Config) validateRateLimiting(errs *fieldErrors) {
	rl := &c.RateLimiting
	switch rl.Storage {
	case StorageMemory:
	case StorageRedis:
		if rl.Redis.URL == "" {
			errs.add("rate_limiting.redis.url", "is required when rate_limiting.storage is redis")
		}
	default:
		errs.add("rate_limiting.storage", "must be %q or %q, got %q", StorageMemory, StorageRedis, rl.Storage)
	}
	if rl.Redis.URL != "" {
		t, err := ParseRedisURL(rl.Redis.URL)
		if err != nil {
			errs.add("rate_limiting.redis.url", "%v", err)
		} else if rl.Redis.SentinelPasswordEnv != "" && t.Mode != RedisSentinel {
			errs.add("rate_limiting.redis.sentinel_password_env", "only a redis+sentinel:// url has sentinels, got a %s url", t.Mode)
		}
	}
	if e := rl.Redis.Epoch; e != "" && !validEpoch(e) {
		errs.add("rate_limiting.redis.epoch", "want <created Unix milliseconds>-<hex digits>, as the replicas report it, got %q", e)
	}
	if f := rl.Redis.HotBudgetSlice; !(f >= 0 && f <= 0.5) {
		errs.add("rate_limiting.redis.hot_budget_slice", "must be a fraction of a budget from 0 to 0.5, got %v", f)
	}
	if lf := rl.Redis.LedgerFallback; lf != nil && (lf.MaxConcurrent < 0 || lf.MaxConcurrent > 64) {
		errs.add("rate_limiting.redis.ledger_fallback.max_concurrent", "must be from 1 to 64 (0: the default, 4), got %d", lf.MaxConcurrent)
	}
	if m := rl.Redis.Checks.Mode; m != "" && m != ChecksReport && m != ChecksEnforce {
		errs.add("rate_limiting.redis.checks.mode", "must be %q or %q, got %q", ChecksReport, ChecksEnforce, m)
	}
	nonNegative(errs, "rate_limiting.redis.checks.interval_seconds", rl.Redis.Checks.IntervalSeconds)
	nonNegative(errs, "rate_limiting.redis.dial_timeout_ms", rl.Redis.DialTimeoutMillis)
	nonNegative(errs, "rate_limiting.redis.read_timeout_ms", rl.Redis.ReadTimeoutMillis)
	nonNegative(errs, "rate_limiting.redis.write_timeout_ms", rl.Redis.WriteTimeoutMillis)
	nonNegative(errs, "rate_limiting.budget_division.replicas", rl.BudgetDivision.Replicas)
	for i, p := range rl.Whitelist {
		if _, err := ParsePrefix(p); err != nil {
			errs.add(fmt.Sprintf("rate_limiting.whitelist[%d]", i), "%v", err)
		}
	}
	if rl.MaxBuckets < 0 {
		errs.add("rate_limiting.max_buckets", "must be positive, got %d", rl.MaxBuckets)
	}
	if rl.MaxAttributeValues < 0 {
		errs.add("rate_limiting.max_attribute_values", "must be positive, got %d", rl.MaxAttributeValues)
	}
	switch rl.Overage {
	case OverageDebt, OverageForgive:
	default:
		errs.add("rate_limiting.overage", "must be %q or %q, got %q", OverageDebt, OverageForgive, rl.Overage)
	}
	if rl.ClientIPv6Prefix < 1 || rl.ClientIPv6Prefix > 128 {
		errs.add("rate_limiting.client_ipv6_prefix", "must be a prefix length from 1 to 128, got %d", rl.ClientIPv6Prefix)
	}
	if rl.RetryPatienceSeconds < 0 {
		errs.add("rate_limiting.retry_patience_seconds", "must be a number of seconds above 0, got %d", rl.RetryPatienceSeconds)
	}
	rl.Limits.Each(func(field string, d DimensionLimits) {
		nonNegative(errs, field+".requests_per_second", d.RequestsPerSecond)
		nonNegative(errs, field+".burst_capacity", d.BurstCapacity)
		nonNegative(errs, field+".tokens_per_minute", d.TokensPerMinute)
		nonNegative(errs, field+".tokens_per_day", d.TokensPerDay)
	})
	for m := range rl.Limits.PerModel {
		if m == "" {
			errs.add("rate_limiting.limits.per_model", "a model name must not be empty")
		}
	}
}

// Each calls fn for every dimension's limits with its field path, per_model entries in
// name order.
func (l *Limits) Each(fn func(field string, d DimensionLimits)) {
	fn("rate_limiting.limits.global", l.Global)
	fn("rate_limiting.limits.per_client", l.PerClient)
	fn("rate_limiting.limits.per_api_key", l.PerAPIKey)
	fn("rate_limiting.limits.per_user", l.PerUser)
	fn("rate_limiting.limits.per_team", l.PerTeam)
	for _, m := range sortedKeys(l.PerModel) {
		fn(fmt.Sprintf("rate_limiting.limits.per_model[%q]", m), l.PerModel[m])
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// CheckRedisURL accepts a URL ParseRedisURL reads: one server, a Redis Cluster or a
// primary found through Sentinel.
func CheckRedisURL(raw string) error {
	_, err := ParseRedisURL(raw)
	return err
}

// ParsePrefix reads a CIDR or a single address.
func ParsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not a CIDR: %q", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not an address or CIDR: %q", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Warnings are problems that do not make the document invalid but make a budget behave
// other than its author probably meant; `proxy validate` prints them.
func (c *Config) Warnings() []string {
	var w []string
	rl := &c.RateLimiting
	tokens := false
	rl.Limits.Each(func(_ string, d DimensionLimits) { tokens = tokens || d.HasTokens() })
	keyOverrides := slices.ContainsFunc(c.APIKeys, func(k APIKey) bool { return k.RateLimitTokensPerMinute > 0 || k.RateLimitTokensPerDay > 0 })
	if rl.Storage == StorageMemory && (tokens || keyOverrides || len(rl.Rules) > 0) && rl.BudgetDivision.Replicas == 0 {
		w = append(w, "rate_limiting: in-memory token budgets with no budget_division: every replica enforces the whole budget, so N replicas admit N times it; set rate_limiting.budget_division.replicas to the number of replicas (1 for a single proxy), or use storage: redis")
	}
	if rl.Storage == StorageRedis && rl.BudgetDivision.Replicas > 1 {
		w = append(w, fmt.Sprintf("rate_limiting.budget_division.replicas: %d is set while storage is redis: the shared Redis buckets hold the fleet total and are not divided; the division applies only to the replica-local buckets used while Redis is unreachable", rl.BudgetDivision.Replicas))
	}
	div := c.Divisor()
	rl.Limits.Each(func(field string, d DimensionLimits) {
		if d.BurstCapacity > 0 && d.RequestsPerSecond == 0 {
			w = append(w, field+".burst_capacity: has no effect without requests_per_second")
		}
		for _, p := range []struct {
			name string
			v    int64
		}{{"tokens_per_minute", d.TokensPerMinute}, {"tokens_per_day", d.TokensPerDay}} {
			if p.v > 0 && p.v/div == 0 {
				w = append(w, fmt.Sprintf("%s.%s: %d divided among %d replicas is 0 per replica: every request is refused", field, p.name, p.v, div))
			}
		}
	})
	for i, r := range rl.Rules {
		for j, win := range r.Windows {
			// Whole-number rolling windows are divided with floor in a replica's memory.
			if win.Rolling != nil && r.Amount != AmountCost && win.Limit > 0 && math.Floor(win.Limit/float64(div)) == 0 {
				w = append(w, fmt.Sprintf("rate_limiting.rules[%d].windows[%d].limit: %v divided among %d replicas is 0 per replica: every request it governs is refused while it is held in memory", i, j, win.Limit, div))
			}
		}
	}
	for _, m := range sortedKeys(rl.Limits.PerModel) {
		// An upstream's models list, the model registry or the catch-all.
		if len(c.ModelUpstreamsFor(m)) == 0 {
			w = append(w, fmt.Sprintf("rate_limiting.limits.per_model[%q]: no upstream serves this model, so the budget never applies", m))
		}
	}
	identity := func(field string, d DimensionLimits, has func(APIKey) bool, what string) {
		if (d.HasTokens() || d.HasRequests()) && !slices.ContainsFunc(c.APIKeys, has) {
			w = append(w, fmt.Sprintf("%s: no api key has %s, so this budget never applies", field, what))
		}
	}
	identity("rate_limiting.limits.per_api_key", rl.Limits.PerAPIKey, func(APIKey) bool { return true }, "been configured")
	identity("rate_limiting.limits.per_user", rl.Limits.PerUser, func(k APIKey) bool { return k.User != "" }, "a user")
	identity("rate_limiting.limits.per_team", rl.Limits.PerTeam, func(k APIKey) bool { return k.Team != "" }, "a team")
	for i, k := range c.APIKeys {
		if k.Bypass && (k.RateLimit > 0 || k.RateLimitBurst > 0 || k.RateLimitTokensPerMinute > 0) {
			w = append(w, fmt.Sprintf("api_keys[%d] (%s): bypass exempts the key from every limit, so its overrides never apply", i, k.Name))
		}
		if k.RateLimitTokensPerMinute > 0 && k.RateLimitTokensPerMinute/div == 0 {
			w = append(w, fmt.Sprintf("api_keys[%d].rate_limit_tokens_per_minute: %d divided among %d replicas is 0 per replica: every request of this key is refused", i, k.RateLimitTokensPerMinute, div))
		}
	}
	return append(w, c.cacheWarnings()...)
}

// validEpoch tells whether e has the form of a durable counters' epoch:
// "<created Unix milliseconds>-<hex digits>".
func validEpoch(e string) bool {
	ms, id, ok := strings.Cut(e, "-")
	if !ok || ms == "" || id == "" || len(ms) > 15 || len(id) > 64 {
		return false
	}
	for _, r := range ms {
		if r < '0' || r > '9' {
			return false
		}
	}
	for _, r := range id {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}

func (c *Config) validateScheduling(errs *fieldErrors) {
	sc := &c.Scheduling
	nonNegative(errs, "scheduling.max_queue_wait_seconds", sc.MaxQueueWaitSeconds)
	nonNegative(errs, "scheduling.max_queue_length", sc.MaxQueueLength)
	nonNegative(errs, "scheduling.aging_seconds", sc.AgingSeconds)
	if sc.OutputWeight < 0 || math.IsNaN(sc.OutputWeight) || math.IsInf(sc.OutputWeight, 0) {
		errs.add("scheduling.output_weight", "must be a positive number, got %v", sc.OutputWeight)
	}
}
