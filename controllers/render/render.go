// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Ports of the proxy container.
const (
	ProxyPort = 8080
	AdminPort = 9090
	// ConfigKey is the ConfigMap key that holds the proxy config document.
	ConfigKey = "proxy.yaml"
	// PodNameEnv is the proxy's environment variable with its pod's name, the replica
	// name of its report Lease.
	PodNameEnv = "POD_NAME"
	// RedisPasswordEnv is the proxy's environment variable with the Redis password.
	RedisPasswordEnv = "TOKENWARDEN_REDIS_PASSWORD"
	// RedisSentinelPasswordEnv is the proxy's environment variable with the sentinels'
	// password.
	RedisSentinelPasswordEnv = "TOKENWARDEN_REDIS_SENTINEL_PASSWORD"
	// RedisCheckPasswordEnv is the proxy's environment variable with the store checks'
	// credential's password.
	RedisCheckPasswordEnv = "TOKENWARDEN_REDIS_CHECK_PASSWORD"
)

// KeyInput is an accepted ApiKey with the SHA-256 of its Secret's key.
type KeyInput struct {
	Key  *twv1alpha1.ApiKey
	Hash string
	// Conflict says, for a key that lost to an older one with the same hash, which.
	Conflict string
	// Read is the caller's index of the key among every key it read.
	Read int
	// Environment is the key's environment: its namespace's EnvironmentLabel.
	Environment string
}

// Fleet is everything the proxy config of one TokenProxy is rendered from.
type Fleet struct {
	Proxy   *twv1alpha1.TokenProxy
	Budgets []*twv1alpha1.TokenBudget // accepted, in creation order
	Keys    []KeyInput                // accepted, by name
	Divisor int64
}

// UpstreamCredentialEnv is the environment variable that carries an upstream's key.
func UpstreamCredentialEnv(name string) string {
	return "TOKENWARDEN_UPSTREAM_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_KEY"
}

// Render builds the proxy config document of a fleet. It holds key hashes only, never
// a key; upstream and Redis credentials are referenced by environment variable.
func Render(f *Fleet) *config.Config {
	p := f.Proxy
	c := &config.Config{
		Listen:       fmt.Sprintf("0.0.0.0:%d", ProxyPort),
		AdminListen:  fmt.Sprintf("0.0.0.0:%d", AdminPort),
		MaxBodyBytes: p.Spec.MaxBodyBytes,
		Auth: config.Auth{
			Mode:           config.AuthRequired,
			TrustedProxies: slices.Clone(p.Spec.Auth.TrustedProxies),
		},
	}
	if p.Spec.Auth.Mode == twv1alpha1.AuthOptional {
		c.Auth.Mode = config.AuthOptional
	}
	for _, u := range p.Spec.Upstreams {
		cu := config.Upstream{Name: u.Name, URL: u.URL, Models: slices.Clone(u.Models), TimeoutSeconds: u.TimeoutSeconds,
			Capacity: renderCapacity(u.Capacity)}
		if u.CredentialSecretRef != nil {
			cu.AuthHeaderEnv = UpstreamCredentialEnv(u.Name)
		}
		cu.Provider = renderProvider(u.Provider)
		c.Upstreams = append(c.Upstreams, cu)
	}
	for _, m := range p.Spec.Models {
		cm := config.Model{Name: m.Name}
		renderRegistry(&cm, &m)
		if pr := m.Price; pr != nil {
			cm.Price = &config.Price{Input: quantityFloat(pr.Input), Output: quantityFloat(pr.Output)}
			if pr.CachedInput != nil {
				v := quantityFloat(*pr.CachedInput)
				cm.Price.CachedInput = &v
			}
		}
		c.Models = append(c.Models, cm)
	}
	c.APIKeys = make([]config.APIKey, 0, len(f.Keys))
	for _, k := range f.Keys {
		s := &k.Key.Spec
		user, team := s.User, s.Team
		if Scoped(p, k.Key) {
			user, team = Qualified(k.Key.Namespace, user), Qualified(k.Key.Namespace, team)
		}
		c.APIKeys = append(c.APIKeys, config.APIKey{
			Name: RenderedName(k.Key), KeySHA256: k.Hash, User: user, Team: team, Tenant: TenantOf(k.Key), Environment: k.Environment,
			RateLimit: s.RequestsPerSecond, RateLimitBurst: s.BurstCapacity, RateLimitTokensPerMinute: s.TokensPerMinute,
			RateLimitTokensPerDay: s.TokensPerDay, Bypass: s.Bypass,
		})
		renderKeyScheduling(s, &c.APIKeys[len(c.APIKeys)-1])
	}
	renderRouting(&p.Spec.Routing, c)
	renderScheduling(p.Spec.Scheduling, c)
	rl := &c.RateLimiting
	rl.Storage = config.StorageMemory
	rl.BudgetDivision.Replicas = f.Divisor
	rl.Whitelist = slices.Clone(p.Spec.Whitelist)
	rl.ClientIPv6Prefix = int(p.Spec.ClientIPv6PrefixLength)
	rl.MaxAttributeValues = p.Spec.MaxAttributeValues
	rl.RetryPatienceSeconds = p.Spec.RetryPatienceSeconds
	Observability(c, p.Spec.Observability)
	Cache(c, p.Spec.Cache)
	if w := p.Spec.CachedInputWeight; w != nil {
		v := quantityFloat(*w)
		rl.CachedInputWeight = &v
	}
	switch p.Spec.Overage {
	case twv1alpha1.OverageForgive:
		rl.Overage = config.OverageForgive
	case twv1alpha1.OverageDebt:
		rl.Overage = config.OverageDebt
	}
	if p.Spec.Storage.Type == twv1alpha1.StorageRedis && p.Spec.Storage.Redis != nil {
		r := p.Spec.Storage.Redis
		rl.Storage = config.StorageRedis
		rl.Redis = config.Redis{URL: r.URL, FallbackToMemory: r.FallbackToMemory, KeyPrefix: p.Namespace + "/" + p.Name}
		// The epoch of the durable counters, as the fleet recorded it (trust fence).
		rl.Redis.Epoch = epochOf(p.Status.DurableEpochs, rl.Redis.KeyPrefix)
		rl.Redis.LedgerAttestation = ledgerAttestationOf(p.Status.DurableEpochs, rl.Redis.KeyPrefix)
		if r.PasswordSecretRef != nil {
			rl.Redis.PasswordEnv = RedisPasswordEnv
		}
		if r.SentinelPasswordSecretRef != nil {
			rl.Redis.SentinelPasswordEnv = RedisSentinelPasswordEnv
		}
		if r.HotBudgetSlicePercent != nil {
			rl.Redis.HotBudgetSlice = float64(*r.HotBudgetSlicePercent) / 100
		}
		rl.Redis.Checks = StoreChecks(r.StoreChecks)
		if lf := r.LedgerFallback; lf != nil {
			rl.Redis.LedgerFallback = &config.LedgerFallback{}
			if lf.MaxConcurrent != nil {
				rl.Redis.LedgerFallback.MaxConcurrent = int(*lf.MaxConcurrent)
			}
		}
	}
	for _, b := range f.Budgets {
		if RendersAsRules(p, b) {
			rl.Rules = append(rl.Rules, budgetRules(p, b)...)
			continue
		}
		l := config.DimensionLimits{
			RequestsPerSecond: b.Spec.RequestsPerSecond, BurstCapacity: b.Spec.BurstCapacity,
			TokensPerMinute: b.Spec.TokensPerMinute, TokensPerDay: b.Spec.TokensPerDay,
		}
		switch b.Spec.Dimension {
		case twv1alpha1.DimensionGlobal:
			rl.Limits.Global = l
		case twv1alpha1.DimensionPerClient:
			rl.Limits.PerClient = l
		case twv1alpha1.DimensionPerAPIKey:
			rl.Limits.PerAPIKey = l
		case twv1alpha1.DimensionPerUser:
			rl.Limits.PerUser = l
		case twv1alpha1.DimensionPerTeam:
			rl.Limits.PerTeam = l
		case twv1alpha1.DimensionPerModel:
			if rl.Limits.PerModel == nil {
				rl.Limits.PerModel = map[string]config.DimensionLimits{}
			}
			rl.Limits.PerModel[b.Spec.Model] = l
		}
	}
	// A stable order: by name, whatever the budgets' ages.
	slices.SortFunc(rl.Rules, func(a, b config.Rule) int { return strings.Compare(a.Name, b.Name) })
	for i, k := range f.Keys {
		if Scoped(p, k.Key) {
			tightenOnly(&c.APIKeys[i], rl.Limits.PerAPIKey)
		}
	}
	return c
}

// tightenOnly leaves out those of a tenant's key's own limits that are no tighter than
// the platform's per-key limits they would replace, so the platform's apply: a key may
// tighten what the platform gives each key, never loosen it. A limit the platform does
// not set, the key's may.
func tightenOnly(k *config.APIKey, platform config.DimensionLimits) {
	looser := func(own, p int64) bool { return p > 0 && own >= p }
	if looser(k.RateLimitTokensPerMinute, platform.TokensPerMinute) {
		k.RateLimitTokensPerMinute = 0
	}
	if looser(k.RateLimitTokensPerDay, platform.TokensPerDay) {
		k.RateLimitTokensPerDay = 0
	}
	if looser(k.RateLimit, platform.RequestsPerSecond) {
		k.RateLimit = 0
	}
	if looser(k.RateLimitBurst, cmp.Or(platform.BurstCapacity, platform.RequestsPerSecond)) {
		k.RateLimitBurst = 0
	}
}

// ResolveConflicts orders the budgets of fleet tp oldest first (creation time, then
// name) and splits them into the winners, which keep every slot they set (slots), and
// the losers, which share a slot with an older winner: conflicted says why, by loser's
// ObjectKey. Under Namespaces a tenant's slots are its own: budgets conflict only within
// one level (the platform's, or one tenant's).
func ResolveConflicts(tp *twv1alpha1.TokenProxy, budgets []*twv1alpha1.TokenBudget) (winners, losers []*twv1alpha1.TokenBudget, conflicted map[string]string) {
	sorted := slices.Clone(budgets)
	slices.SortFunc(sorted, func(a, b *twv1alpha1.TokenBudget) int { return olderFirst(a, b) })
	owner := map[string]string{}
	conflicted = map[string]string{}
	for _, b := range sorted {
		ss := slots(tp, b)
		lost := false
		for _, s := range ss {
			if w, taken := owner[s.key]; taken {
				conflicted[ObjectKey(b)] = fmt.Sprintf("TokenBudget %s is older and sets %s", w, s.what)
				lost = true
				break
			}
		}
		if lost {
			losers = append(losers, b)
			continue
		}
		for _, s := range ss {
			owner[s.key] = DisplayName(b)
		}
		winners = append(winners, b)
	}
	return winners, losers, conflicted
}

// olderFirst orders objects by creation time, then name, then namespace: the order in which
// conflicts are won.
func olderFirst(a, b metav1.Object) int {
	if c := a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time); c != 0 {
		return c
	}
	if c := strings.Compare(a.GetName(), b.GetName()); c != 0 {
		return c
	}
	// Objects of one name from two namespaces (a fleet that accepts other namespaces).
	return strings.Compare(a.GetNamespace(), b.GetNamespace())
}

// ResolveKeyConflicts keeps, of the keys whose Secrets hold the same key, the oldest
// (creation time, then name): the proxy refuses a document with one hash twice, which
// would freeze the whole fleet on its last config. The winners keep their order; each
// loser names its winner, never the key.
func ResolveKeyConflicts(keys []KeyInput) (winners, losers []KeyInput) {
	// Keys sharing a hash are found by sorting the keys by hash, without a map of
	// every hash: most fleets have none, and a 50,000-key fleet reads every key on
	// every reconcile.
	byHash := make([]int32, len(keys))
	for i := range byHash {
		byHash[i] = int32(i)
	}
	slices.SortFunc(byHash, func(a, b int32) int { return strings.Compare(keys[a].Hash, keys[b].Hash) })
	var lost map[int32]string
	for start := 0; start < len(byHash); {
		end := start + 1
		for end < len(byHash) && keys[byHash[end]].Hash == keys[byHash[start]].Hash {
			end++
		}
		if end-start > 1 {
			group := slices.Clone(byHash[start:end])
			slices.SortStableFunc(group, func(a, b int32) int { return olderFirst(keys[a].Key, keys[b].Key) })
			if lost == nil {
				lost = map[int32]string{}
			}
			for _, i := range group[1:] {
				lost[i] = fmt.Sprintf("ApiKey %s is older and its Secret holds the same key", DisplayName(keys[group[0]].Key))
			}
		}
		start = end
	}
	if len(lost) == 0 {
		return keys, nil
	}
	for i, k := range keys {
		if msg, ok := lost[int32(i)]; ok {
			k.Conflict = msg
			losers = append(losers, k)
			continue
		}
		winners = append(winners, k)
	}
	return winners, losers
}

// StoreChecks renders spec.storage.redis.storeChecks (nil: the proxy's defaults).
func StoreChecks(c *twv1alpha1.RedisStoreChecks) config.RedisChecks {
	var out config.RedisChecks
	if c == nil {
		return out
	}
	switch c.Mode {
	case twv1alpha1.StoreCheckEnforce:
		out.Mode = config.ChecksEnforce
	case twv1alpha1.StoreCheckReport:
		out.Mode = config.ChecksReport
	}
	out.IntervalSeconds = int64(c.IntervalSeconds)
	out.Username = c.Username
	if c.PasswordSecretRef != nil {
		out.PasswordEnv = RedisCheckPasswordEnv
	}
	return out
}
