// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package config is the proxy configuration document: its Go type, defaults,
// validation and warnings. It is the contract between the operator, which renders it
// into a ConfigMap, and the proxy, which loads it from that ConfigMap or from a file.
// It has no Kubernetes imports on purpose.
package config

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"sigs.k8s.io/yaml"
)

// Config is one proxy's whole configuration. Field names follow the YAML document in
// docs/proxy-config.md; unknown fields are an error, so a typo never silently drops a
// budget.
type Config struct {
	// Generation identifies this document. The operator writes a number that grows with
	// every change it renders, so a fleet's pods can be compared by it; a standalone
	// document may leave it 0.
	Generation int64 `json:"generation,omitempty"`

	// Listen is the data-plane HTTP address. Default 127.0.0.1:8080.
	Listen string `json:"listen,omitempty"`
	// AdminListen serves /metrics, /healthz, /readyz and /admin/effective. Default 127.0.0.1:9090.
	AdminListen string `json:"admin_listen,omitempty"`
	// MaxBodyBytes is the largest request body the proxy accepts; larger ones get 413.
	// Default 16 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`

	// Upstreams are the backends; the first whose models list holds the request's model
	// serves it, and an upstream with an empty list serves every other model.
	Upstreams []Upstream `json:"upstreams"`
	// Models are the client-facing models with what they cost, for budgets whose
	// amount is cost.
	Models []Model `json:"models,omitempty"`
	// Routing holds the fleet's defaults for the models (routing.go).
	Routing Routing `json:"routing,omitzero"`

	Auth         Auth         `json:"auth,omitempty"`
	APIKeys      []APIKey     `json:"api_keys,omitempty"`
	RateLimiting RateLimiting `json:"rate_limiting,omitempty"`
	// Scheduling orders requests waiting for an upstream's capacity.
	Scheduling Scheduling `json:"scheduling,omitzero"`
	// Agents bounds the runs kept for the keys' run budgets (agents.go).
	Agents Agents `json:"agents,omitzero"`
	// Observability is the access log, tracing and the refusal audit.
	Observability Observability `json:"observability,omitzero"`
	// Ledger is the durable record of every settlement (ledger.go).
	Ledger Ledger `json:"ledger,omitzero"`
	// Cache answers identical requests without a backend call (cache.go). Off unless set.
	Cache Cache `json:"cache,omitzero"`
}

// Upstream is one OpenAI- or Anthropic-compatible backend.
type Upstream struct {
	// Name identifies the upstream in metrics and logs.
	Name string `json:"name"`
	// URL is scheme://host:port with an optional base path prepended to every request path.
	URL string `json:"url"`
	// Models are the client-facing model names this upstream serves; empty serves every
	// model that no other upstream lists.
	Models []string `json:"models,omitempty"`
	// AuthHeaderEnv names an environment variable whose value the proxy sends as the
	// upstream credential (Authorization: Bearer on OpenAI routes, x-api-key on
	// Anthropic routes). Empty: the client's credential is not forwarded and none is added.
	AuthHeaderEnv string `json:"auth_header_env,omitempty"`
	// TimeoutSeconds bounds the wait for the upstream's response headers. Default 300.
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
	// Capacity is what the upstream can run at once. Absent (or all zero): the proxy
	// forwards every admitted request at once, as without a scheduler.
	Capacity *Capacity `json:"capacity,omitempty"`
	// Provider is the API family the upstream speaks: openai or anthropic (models.go).
	// Absent: both, as the request's route says.
	Provider Provider `json:"provider,omitempty"`
}

// Capacity bounds an upstream's in-flight work; at it, admitted requests wait in the
// proxy's queue (see Scheduling). A zero field is no bound.
type Capacity struct {
	// MaxInFlightRequests bounds the requests forwarded and not yet answered in full.
	MaxInFlightRequests int64 `json:"max_in_flight_requests,omitempty"`
	// MaxInFlightTokens bounds the tokens those requests reserved (input estimate plus
	// output reservation). A single larger request runs alone.
	MaxInFlightTokens int64 `json:"max_in_flight_tokens,omitempty"`
	// Learn, when set, learns the in-flight request bound from the upstream's answers
	// (learn.go); it needs MaxInFlightRequests, its start and ceiling.
	Learn *LearnCapacity `json:"learn,omitempty"`
}

// Enabled reports whether the capacity bounds anything.
func (c *Capacity) Enabled() bool {
	return c != nil && (c.MaxInFlightRequests > 0 || c.MaxInFlightTokens > 0)
}

// Scheduling orders the requests that wait for an upstream's capacity. It applies to
// every upstream with a capacity; without one it does nothing.
type Scheduling struct {
	// MaxQueueWaitSeconds bounds a wait: a request still queued then gets 429
	// queue_timeout and its reservation is released (0 or absent: 30).
	MaxQueueWaitSeconds int64 `json:"max_queue_wait_seconds,omitempty"`
	// MaxQueueLength bounds each upstream's waiting requests; one more gets 429
	// queue_full (0 or absent: 1000).
	MaxQueueLength int64 `json:"max_queue_length,omitempty"`
	// MaxQueueBytes bounds the request bodies each upstream's waiting requests hold in
	// memory; a request that would take them past it gets 429 queue_full (0 or absent:
	// 256 MiB; agents.go).
	MaxQueueBytes int64 `json:"max_queue_bytes,omitempty"`
	// AgingSeconds raises a waiting class by one class for every AgingSeconds its
	// oldest request has waited (0 or absent: no aging; the classes' minimum shares
	// keep batch and background from starving).
	AgingSeconds int64 `json:"aging_seconds,omitempty"`
	// OutputWeight is what an output token counts in token-fair queueing, against 1 for
	// an input token (0 or absent: 2).
	OutputWeight float64 `json:"output_weight,omitempty"`
	// Classes are each class's own longest wait and output cap (agents.go).
	Classes ClassSettings `json:"classes,omitzero"`
}

// Scheduling defaults.
const (
	DefaultMaxQueueWaitSeconds = 30
	DefaultMaxQueueLength      = 1000
	DefaultOutputWeight        = 2
	// DefaultBatchMinSharePercent and DefaultBackgroundMinSharePercent are the shares
	// of an upstream's capacity that batch and background keep while they wait.
	DefaultBatchMinSharePercent      = 10
	DefaultBackgroundMinSharePercent = 5
	// MaxMinSharePercent is the largest minimum share a class may have, so that the
	// two lower classes together never take more than the whole capacity.
	MaxMinSharePercent = 50
)

// MaxQueueWait is max_queue_wait_seconds in force. The scheduling fields are read
// through these methods rather than written by Default, so that a rendered document
// does not change with them.
func (s *Scheduling) MaxQueueWait() time.Duration {
	return time.Duration(cmp.Or(s.MaxQueueWaitSeconds, DefaultMaxQueueWaitSeconds)) * time.Second
}

// QueueLength is max_queue_length in force.
func (s *Scheduling) QueueLength() int { return int(cmp.Or(s.MaxQueueLength, DefaultMaxQueueLength)) }

// Aging is aging_seconds in force (0: none).
func (s *Scheduling) Aging() time.Duration { return time.Duration(s.AgingSeconds) * time.Second }

// OutputTokenWeight is output_weight in force.
func (s *Scheduling) OutputTokenWeight() float64 { return cmp.Or(s.OutputWeight, DefaultOutputWeight) }

// Priority classes of an API key (api_keys[].priority).
const (
	PriorityInteractive = "interactive"
	PriorityBatch       = "batch"
	PriorityBackground  = "background"
)

// PriorityHeader is the request header that may lower a request's priority class
// below its key's (never raise it).
const PriorityHeader = "X-Tokenwarden-Priority"

// AuthMode says whether requests must carry a known API key.
type AuthMode string

const (
	// AuthRequired refuses a request without a known key with 401.
	AuthRequired AuthMode = "required"
	// AuthOptional admits anonymous requests; the identity-scoped dimensions
	// (api_key, user, team) are skipped for them. A presented but unknown key is still 401.
	AuthOptional AuthMode = "optional"
)

// Auth configures client authentication.
type Auth struct {
	// Mode is required (default) or optional.
	Mode AuthMode `json:"mode,omitempty"`
	// TrustedProxies are CIDRs whose X-Forwarded-For header is believed when resolving
	// the client address for per_client budgets and the whitelist.
	TrustedProxies []string `json:"trusted_proxies,omitempty"`
}

// APIKey is one client credential. Only the SHA-256 of the key appears here.
type APIKey struct {
	// Name is the key's stable identity: the per_api_key bucket, metric labels and logs.
	Name string `json:"name"`
	// KeySHA256 is the lowercase hex SHA-256 of the key the client sends.
	KeySHA256 string `json:"key_sha256"`
	// User and Team identify the per_user and per_team buckets the key draws on.
	User string `json:"user,omitempty"`
	Team string `json:"team,omitempty"`
	// Tenant is the tenant the key belongs to: the rules of that tenant (a rule's
	// tenant) govern its traffic, and a rule of dimension tenant counts it under this
	// name. Empty: the key is the platform's own, under no tenant's rules.
	Tenant string `json:"tenant,omitempty"`
	// Environment is the environment the key's traffic is (production, staging):
	// the platform sets it, never the tenant; rules select on it and count by it.
	Environment string `json:"environment,omitempty"`
	// RateLimit overrides per_api_key.requests_per_second for this key (0: none).
	RateLimit int64 `json:"rate_limit,omitempty"`
	// RateLimitBurst overrides the burst capacity of the key's request rate (0: none).
	RateLimitBurst int64 `json:"rate_limit_burst,omitempty"`
	// RateLimitTokensPerMinute overrides per_api_key.tokens_per_minute for this key
	// (0: none). It is a fleet total and is divided by budget_division.replicas.
	RateLimitTokensPerMinute int64 `json:"rate_limit_tokens_per_minute,omitempty"`
	// RateLimitTokensPerDay overrides per_api_key.tokens_per_day for this key (0:
	// none), a fleet total divided like the minute override.
	RateLimitTokensPerDay int64 `json:"rate_limit_tokens_per_day,omitempty"`
	// Bypass exempts the key from every limit.
	Bypass bool `json:"bypass,omitempty"`
	// Priority is the key's class in an upstream's queue: interactive, batch or
	// background (absent: interactive). A request may lower it with the
	// x-tokenwarden-priority header, never raise it.
	Priority string `json:"priority,omitempty"`
	// Weight is the key's share of token service against the other keys of its class
	// when they wait (0 or absent: 1).
	Weight float64 `json:"weight,omitempty"`
	// MaxInFlight bounds the key's requests forwarded and not yet answered in full;
	// one more gets 429 in_flight_limit (0 or absent: none).
	MaxInFlight int64 `json:"max_in_flight,omitempty"`
	// RunTokenBudget bounds the tokens one run of the key (its x-tokenwarden-run-id)
	// reserves and spends; a request beyond it gets 429 run_budget_exceeded (0 or absent:
	// none).
	RunTokenBudget int64 `json:"run_token_budget,omitempty"`
	// RunMaxSteps bounds the requests one run of the key sends; one more gets 429
	// run_steps_exceeded (0 or absent: none).
	RunMaxSteps int64 `json:"run_max_steps,omitempty"`
}

// Storage selects where buckets live.
type Storage string

const (
	// StorageMemory keeps buckets in each replica's memory; a fleet needs budget_division.
	StorageMemory Storage = "memory"
	// StorageRedis keeps shared buckets in one Redis server.
	StorageRedis Storage = "redis"
)

// RateLimiting holds every limit and where its state lives.
type RateLimiting struct {
	// Storage is memory (default) or redis.
	Storage Storage `json:"storage,omitempty"`
	Redis   Redis   `json:"redis,omitempty"`
	// BudgetDivision divides every token allowance among the replicas of a fleet.
	BudgetDivision BudgetDivision `json:"budget_division,omitempty"`
	// Whitelist are client CIDRs exempt from every limit.
	Whitelist []string `json:"whitelist,omitempty"`
	// MaxBuckets bounds each bucket map, one per dimension and kind (request count,
	// minute, day): a full map admits without charging on that dimension only, and
	// counts it. Default 100000.
	MaxBuckets int64 `json:"max_buckets,omitempty"`
	// MaxAttributeValues bounds the distinct values of a client-supplied attribute
	// (session, agent, task, run, request_fingerprint) that one window of a rule that
	// counts by it holds per API key per window: a value beyond them is counted in the
	// key's one overflow subject. Default 1000.
	MaxAttributeValues int64 `json:"max_attribute_values,omitempty"`
	// Overage is what settlement does with usage beyond the reservation that a bucket
	// cannot cover: debt (default) drives the bucket below zero, at most one capacity,
	// and the tenant repays it by waiting; forgive consumes nothing from that bucket
	// rather than drain it partly.
	Overage Overage `json:"overage,omitempty"`
	// ClientIPv6Prefix groups IPv6 clients for per_client budgets: every address in
	// one prefix of this length is one client. Default 64; 1 to 128. IPv4 clients (and
	// IPv4-mapped IPv6 addresses) are one client per address.
	ClientIPv6Prefix int `json:"client_ipv6_prefix,omitempty"`
	// RetryPatienceSeconds is how long a client is expected to wait before a retry:
	// a 429 whose Retry-After is longer, like one for a request larger than its whole
	// budget, also carries x-should-retry: false, so that the SDKs fail at once
	// instead of sleeping. 0 or absent is the default, 60 seconds (the longest wait
	// openai-node honours); RetryPatience reads it.
	RetryPatienceSeconds int64 `json:"retry_patience_seconds,omitempty"`
	// Limits are the budgets per dimension: one for every subject of it (the limits shape).
	Limits Limits `json:"limits,omitempty"`
	// Rules are budgets in the general rule shape: subjects, fan-out, amounts
	// (tokens, input or output tokens, requests, cost), rolling and calendar windows,
	// block or warn. They stack with Limits (see Rule for precedence).
	Rules []Rule `json:"rules,omitempty"`
	// CachedInputWeight is how much an input token read from the backend's prompt
	// cache counts in the tokens and input_tokens amounts: 0 to 1, default 1 (a cached
	// token counts in full, as any other input token). Cost uses the model's cached_input price.
	CachedInputWeight *float64 `json:"cached_input_weight,omitempty"`
}

// CachedWeight is the cached_input_weight in force.
func (rl *RateLimiting) CachedWeight() float64 {
	if rl.CachedInputWeight != nil {
		return *rl.CachedInputWeight
	}
	return 1
}

// Overage selects what happens to an overage a bucket cannot cover.
type Overage string

const (
	// OverageDebt drives the bucket below zero, bounded at minus its capacity.
	OverageDebt Overage = "debt"
	// OverageForgive consumes nothing from a bucket that cannot cover the overage.
	OverageForgive Overage = "forgive"
)

// Redis configures the shared store.
type Redis struct {
	// URL is redis://[user:password@]host:port[/db] (rediss:// for TLS) for one
	// server, redis+cluster://host:port[,host:port...] for a Redis Cluster, or
	// redis+sentinel://host:port[,host:port...]/MASTER[/db] for a primary found
	// through Sentinel (see ParseRedisURL).
	URL string `json:"url,omitempty"`
	// SentinelPasswordEnv names an environment variable holding the sentinels' own
	// password (a redis+sentinel:// URL only).
	SentinelPasswordEnv string `json:"sentinel_password_env,omitempty"`
	// PasswordEnv names an environment variable holding the password, so the document
	// need not carry it.
	PasswordEnv string `json:"password_env,omitempty"`
	// KeyPrefix namespaces this fleet's keys (and is their hash tag), so several fleets
	// can share one Redis. Default "tokenwarden".
	KeyPrefix string `json:"key_prefix,omitempty"`
	// FallbackToMemory admits on replica-local buckets at the divided share while Redis
	// is unreachable (default true); false answers 503 with Retry-After: 5.
	FallbackToMemory *bool `json:"fallback_to_memory,omitempty"`
	// Epoch is the epoch of the fleet's durable counters (calendar windows and cost
	// rules), "<created Unix ms>-<hex>", as the control plane recorded it from the
	// replicas' reports: a replica whose Redis does not hold it has lost state, and
	// answers every request its durable rules govern with 503 budget_recovering until
	// the balances are restored or attested (docs/runbooks.md). Empty: the epoch Redis
	// holds, created when it holds none (a brand-new fleet). A reload applies it.
	Epoch string `json:"epoch,omitempty"`
	// LedgerAttestation, written by the control plane and never by hand, tells the
	// replicas that the durable counters lost under an epoch may be attested from the
	// fleet's spend ledger: every live replica has flushed its settlements into it
	// past the loss (docs/runbooks.md, "Attested from the ledger"). A reload applies it.
	LedgerAttestation *LedgerAttestation `json:"ledger_attestation,omitempty"`
	// LedgerFallback, when set, lets the cost budgets counted by API key, user, team
	// or tenant answer from the fleet's PostgreSQL spend ledger while Redis is
	// unreachable, instead of failing closed (docs/ledger.md, "The ledger fallback").
	// Applied at the next restart.
	LedgerFallback *LedgerFallback `json:"ledger_fallback,omitempty"`
	// HotBudgetSlice, from 0 to 0.5, serves the global and per-model token budgets
	// from slices of this fraction of their capacity that each replica takes from Redis
	// and spends locally: one call per slice instead of one per request on the keys
	// every request touches. Replicas hold at most one slice each unspent (returned
	// when idle for a second). 0 (the default): every request is decided in Redis.
	HotBudgetSlice float64 `json:"hot_budget_slice,omitempty"`
	// DialTimeoutMillis, ReadTimeoutMillis and WriteTimeoutMillis bound each Redis call,
	// so an unreachable Redis costs milliseconds. Defaults 100, 50, 50.
	DialTimeoutMillis  int64 `json:"dial_timeout_ms,omitempty"`
	ReadTimeoutMillis  int64 `json:"read_timeout_ms,omitempty"`
	WriteTimeoutMillis int64 `json:"write_timeout_ms,omitempty"`
	// Checks configure the store checks: at start and every interval the proxy checks
	// the Redis it counts in (docs/redis.md, "Store checks").
	Checks RedisChecks `json:"checks,omitempty"`
}

// LedgerAttestation is the control plane's word that the durable counters lost under
// Epoch may be attested from the spend ledger.
type LedgerAttestation struct {
	// Epoch is the epoch lost: the one the fenced replicas run under.
	Epoch string `json:"epoch"`
	// FlushedThroughMillis is the least of the live replicas' flushed-through times
	// (Unix milliseconds): every settlement before it is in the ledger.
	FlushedThroughMillis int64 `json:"flushed_through_ms"`
}

// LedgerFallback configures the ledger fallback.
type LedgerFallback struct {
	// MaxConcurrent bounds the ledger sums a replica reads at once (default 4, at
	// most 64); a request that finds none free is answered 503 with Retry-After.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
}

// Store-check modes.
const (
	// ChecksReport reports a failed check (metric, log, /admin/durable); the default.
	ChecksReport = "report"
	// ChecksEnforce also fences the calendar and cost rules while a check fails.
	ChecksEnforce = "enforce"
)

// RedisChecks configure the checks of the counters' Redis: maxmemory-policy
// noeviction, no destructive command for the fleet's user, cluster-require-full-coverage
// no on a cluster, and no keys evicted.
type RedisChecks struct {
	// Mode is "report" (the default: a failed check is reported) or "enforce" (a failed
	// check also fences the calendar and cost rules until it passes). Evicted keys
	// fence them in both modes.
	Mode string `json:"mode,omitempty"`
	// IntervalSeconds is how often the checks run after the first, at start. Default 60.
	IntervalSeconds int64 `json:"interval_seconds,omitempty"`
	// Username and PasswordEnv are the check credential: a Redis user that may run
	// CONFIG GET, ACL DRYRUN and INFO, which the fleet's least-privilege user may not.
	// Without them the checks run as the fleet's user and skip what it may not run.
	Username    string `json:"username,omitempty"`
	PasswordEnv string `json:"password_env,omitempty"`
}

// BudgetDivision tells one replica what share of each fleet total it owns.
type BudgetDivision struct {
	// Replicas divides every token allowance (integer floor, per period). 0 means no
	// division is configured (each replica enforces the whole number); the operator
	// writes the fleet's replica count.
	Replicas int64 `json:"replicas,omitempty"`
}

// Limits are the budgets of the six admission-time dimensions.
type Limits struct {
	Global    DimensionLimits `json:"global,omitempty"`
	PerClient DimensionLimits `json:"per_client,omitempty"`
	PerAPIKey DimensionLimits `json:"per_api_key,omitempty"`
	PerUser   DimensionLimits `json:"per_user,omitempty"`
	PerTeam   DimensionLimits `json:"per_team,omitempty"`
	// PerModel is keyed by the client-facing model name.
	PerModel map[string]DimensionLimits `json:"per_model,omitempty"`
}

// DimensionLimits is one dimension's request-count and token budgets. Every field 0 or
// absent is unlimited.
type DimensionLimits struct {
	// RequestsPerSecond is the request refill rate.
	RequestsPerSecond int64 `json:"requests_per_second,omitempty"`
	// BurstCapacity is the request bucket's size (default: one second of the rate).
	BurstCapacity int64 `json:"burst_capacity,omitempty"`
	// TokensPerMinute is the minute budget: capacity one minute of the rate, refilled
	// continuously at tokens_per_minute/60 per second.
	TokensPerMinute int64 `json:"tokens_per_minute,omitempty"`
	// TokensPerDay is the day budget: capacity one day of the rate, refilled
	// continuously at tokens_per_day/86400 per second (it does not reset at midnight).
	TokensPerDay int64 `json:"tokens_per_day,omitempty"`
}

// HasTokens reports whether either token period is limited.
func (d DimensionLimits) HasTokens() bool { return d.TokensPerMinute > 0 || d.TokensPerDay > 0 }

// HasRequests reports whether the request rate is limited.
func (d DimensionLimits) HasRequests() bool { return d.RequestsPerSecond > 0 }

// Defaults.
const (
	DefaultListen             = "127.0.0.1:8080"
	DefaultAdminListen        = "127.0.0.1:9090"
	DefaultMaxBodyBytes       = 16 << 20
	DefaultMaxBuckets         = 100000
	DefaultMaxAttributeValues = 1000
	DefaultClientIPv6Prefix   = 64
	DefaultUpstreamTimeout    = 300
	DefaultRedisDialTimeoutMs = 100
	DefaultRedisIOTimeoutMs   = 50
	DefaultRetryPatience      = 60
)

// Parse decodes a YAML (or JSON) document strictly, applies the defaults and validates
// it. The error names the offending field. A JSON document (the form the operator
// renders a large fleet's document in) takes a fast path with the same strictness:
// unknown fields and duplicate keys are refused as in YAML, with the same errors for
// unknown fields.
func Parse(data []byte) (*Config, error) { return parse(data, nil) }

// ParseKeys is Parse of the document with keys as its api_keys (the document's own
// are replaced): the same defaults and validation, and the same errors, without
// encoding and decoding the keys, which are most of a large fleet's document. The
// operator checks what it renders with it.
func ParseKeys(data []byte, keys []APIKey) (*Config, error) { return parse(data, keys) }

func parse(data []byte, keys []APIKey) (*Config, error) {
	var c Config
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, fmt.Errorf("the document is empty")
	}
	if keys == nil {
		c.APIKeys = keyRoom(data)
	}
	var err error
	if trimmed[0] == '{' {
		err = decodeJSON(trimmed, &c)
	} else {
		err = yaml.UnmarshalStrict(data, &c)
	}
	if err != nil {
		if unknown := unknownFields(data); len(unknown) > 0 {
			var errs fieldErrors
			for _, f := range unknown {
				errs.add(f, "unknown field (a typo here would silently drop a limit, so it is refused)")
			}
			return nil, errors.Join(errs...)
		}
		return nil, fmt.Errorf("parse: %w", err)
	}
	if keys != nil {
		c.APIKeys = keys
	}
	c.Default()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// keyRoom is an empty api_keys list with room for every key of the document, one
// key_sha256 each (nil when it names none): decoded into, the keys are allocated once,
// where growing the list by a quarter at a time allocates about five times their size
// (50 MB for 50,000 keys).
func keyRoom(data []byte) []APIKey {
	n := bytes.Count(data, []byte("key_sha256"))
	if n == 0 {
		return nil
	}
	return make([]APIKey, 0, n)
}

// Marshal renders the document as YAML: the form people read and write.
func (c *Config) Marshal() ([]byte, error) { return yaml.Marshal(c) }

// Render renders the document as JSON, which is also YAML and means the same: the
// form the operator writes for a document too large for one ConfigMap, which the
// proxy parses in a fraction of the time and memory YAML costs (Parse). The API keys
// come first, one to a line, and the generation last, so that a document cut into
// chunks at line breaks (Split) keeps the chunks before a changed key as they were.
func (c *Config) Render() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	// One allocation for the keys (about 160 bytes each), not a doubling per size.
	b.Grow(4096 + 192*len(c.APIKeys))
	b.WriteString("{")
	if len(c.APIKeys) > 0 {
		b.WriteString("\"api_keys\":[\n")
		for i := range c.APIKeys {
			if err := enc.Encode(&c.APIKeys[i]); err != nil {
				return nil, err
			}
			b.Truncate(b.Len() - 1) // the Encoder's newline
			if i < len(c.APIKeys)-1 {
				b.WriteString(",")
			}
			b.WriteString("\n")
		}
		b.WriteString("],\n")
	}
	rest := *c
	rest.APIKeys, rest.Generation = nil, 0
	start := b.Len()
	if err := enc.Encode(&rest); err != nil {
		return nil, err
	}
	// {"listen":...}\n: the members after the keys; upstreams is never omitted.
	inner := bytes.Clone(b.Bytes()[start+1 : b.Len()-2])
	b.Truncate(start)
	b.Write(inner)
	if c.Generation != 0 {
		fmt.Fprintf(&b, ",\n\"generation\":%d", c.Generation)
	}
	b.WriteString("}\n")
	return b.Bytes(), nil
}

// WithGeneration returns the Render of a Config whose Generation is 0, doc, as if
// rendered with Generation g: Render writes the generation last, so a changed document
// is encoded once whatever generation it is given.
func WithGeneration(doc []byte, g int64) []byte {
	if g == 0 {
		return doc
	}
	body := bytes.TrimSuffix(doc, []byte("}\n"))
	out := make([]byte, 0, len(doc)+32)
	out = append(out, body...)
	out = fmt.Appendf(out, ",\n\"generation\":%d}\n", g)
	return out
}

// Digest is the hex SHA-256 of a document's bytes: what the proxy reports as the
// config it runs, comparable across the pods of a fleet.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Default fills in every unset field that has a default.
func (c *Config) Default() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Auth.Mode == "" {
		c.Auth.Mode = AuthRequired
	}
	for i := range c.Upstreams {
		if c.Upstreams[i].TimeoutSeconds == 0 {
			c.Upstreams[i].TimeoutSeconds = DefaultUpstreamTimeout
		}
	}
	rl := &c.RateLimiting
	if rl.Storage == "" {
		rl.Storage = StorageMemory
	}
	if rl.MaxBuckets == 0 {
		rl.MaxBuckets = DefaultMaxBuckets
	}
	if rl.MaxAttributeValues == 0 {
		rl.MaxAttributeValues = DefaultMaxAttributeValues
	}
	if rl.Overage == "" {
		rl.Overage = OverageDebt
	}
	if rl.ClientIPv6Prefix == 0 {
		rl.ClientIPv6Prefix = DefaultClientIPv6Prefix
	}
	rl.defaultRules()
	if rl.Redis.FallbackToMemory == nil {
		t := true
		rl.Redis.FallbackToMemory = &t
	}
	if rl.Redis.KeyPrefix == "" {
		rl.Redis.KeyPrefix = "tokenwarden"
	}
	if rl.Redis.Checks.Mode == "" {
		rl.Redis.Checks.Mode = ChecksReport
	}
	if rl.Redis.Checks.IntervalSeconds == 0 {
		rl.Redis.Checks.IntervalSeconds = 60
	}
	if rl.Redis.DialTimeoutMillis == 0 {
		rl.Redis.DialTimeoutMillis = DefaultRedisDialTimeoutMs
	}
	if rl.Redis.ReadTimeoutMillis == 0 {
		rl.Redis.ReadTimeoutMillis = DefaultRedisIOTimeoutMs
	}
	if rl.Redis.WriteTimeoutMillis == 0 {
		rl.Redis.WriteTimeoutMillis = DefaultRedisIOTimeoutMs
	}
}

// RetryPatience is the rate_limiting.retry_patience_seconds in force: the longest
// Retry-After a client is told to wait for. It is read here rather than written by
// Default, so that a rendered document does not change with it.
func (c *Config) RetryPatience() time.Duration {
	if s := c.RateLimiting.RetryPatienceSeconds; s > 0 {
		return time.Duration(s) * time.Second
	}
	return DefaultRetryPatience * time.Second
}

// MaxDrainTimeout bounds the drain a stopping proxy derives from its upstreams.
const MaxDrainTimeout = 10 * time.Minute

// DrainTimeout is how long a stopping proxy waits for the requests and streams in
// flight: the largest upstream timeout (DefaultUpstreamTimeout for an unset one), at
// most MaxDrainTimeout. The operator sizes the pods' termination grace period from it.
func DrainTimeout(upstreamTimeoutSeconds ...int64) time.Duration {
	longest := int64(0)
	for _, t := range upstreamTimeoutSeconds {
		if t <= 0 {
			t = DefaultUpstreamTimeout
		}
		longest = max(longest, t)
	}
	if longest == 0 {
		longest = DefaultUpstreamTimeout
	}
	return min(time.Duration(longest)*time.Second, MaxDrainTimeout)
}

// DrainTimeout is the drain of this document's upstreams (see the function); an
// upstream with a capacity adds the longest queue wait to its timeout, as a request
// may wait that long before it is forwarded.
func (c *Config) DrainTimeout() time.Duration {
	ts := make([]int64, 0, len(c.Upstreams))
	for _, u := range c.Upstreams {
		t := u.TimeoutSeconds
		if u.Capacity.Enabled() {
			t = cmp.Or(t, DefaultUpstreamTimeout) + int64(c.Scheduling.LongestQueueWait()/time.Second)
		}
		ts = append(ts, t)
	}
	return DrainTimeout(ts...)
}

// Divisor is the budget division in force: budget_division.replicas, or 1 when unset.
func (c *Config) Divisor() int64 {
	if c.RateLimiting.BudgetDivision.Replicas > 0 {
		return c.RateLimiting.BudgetDivision.Replicas
	}
	return 1
}
