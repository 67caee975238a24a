// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package metrics defines the proxy's Prometheus families. Every label value comes
// from a bounded set: dimension and period names, outcomes, route names, upstream and
// API key names from the config. Metrics register on the Registerer they are given;
// there is no global registry.
package metrics

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/schedule"
)

// Metrics holds every family the proxy exports.
type Metrics struct {
	// Providers are the model registry's and upstream health's families (providers.go).
	Providers *Providers

	TokenBudgetTokens        *prometheus.CounterVec // rate_limit_token_budget_tokens_total{dimension,outcome}
	TokenBudgetPeriodTokens  *prometheus.CounterVec // rate_limit_token_budget_period_tokens_total{dimension,budget,outcome}
	TokenBudgetRefusals      *prometheus.CounterVec // rate_limit_token_budget_refusals_total{dimension}
	TokenBudgetPeriodRefusal *prometheus.CounterVec // rate_limit_token_budget_period_refusals_total{dimension,budget}
	Exceeded                 *prometheus.CounterVec // rate_limit_exceeded_total{limit_type}
	SkippedVec               *prometheus.CounterVec // rate_limit_skipped_total{dimension}
	RequestRefusals          *prometheus.CounterVec // rate_limit_request_refusals_total{dimension}
	RedisUnavailableVec      *prometheus.CounterVec // rate_limit_redis_unavailable_total{dimension,action}
	RedisPipelineDuration    prometheus.Histogram   // tokenwarden_redis_pipeline_duration_seconds
	RedisOperations          *prometheus.CounterVec // tokenwarden_redis_operations_total{operation}

	Requests         *prometheus.CounterVec   // tokenwarden_requests_total{route,code}
	RequestDuration  *prometheus.HistogramVec // tokenwarden_request_duration_seconds{route}
	UpstreamDuration *prometheus.HistogramVec // tokenwarden_upstream_duration_seconds{upstream}
	UpstreamErrors   *prometheus.CounterVec   // tokenwarden_upstream_errors_total{upstream}
	Usage            *prometheus.CounterVec   // tokenwarden_usage_tokens_total{model,type}
	Settlements      *prometheus.CounterVec   // tokenwarden_settlements_total{result}
	// Observability counts the access log's lines.
	Observability *Observability
	// Cache is the response cache's families (cache.go).
	Cache *Cache
	// RedisShared watches the slot groups' releases and the leased slices (redisshared.go).
	RedisShared *RedisShared

	KeyTokensVec *prometheus.CounterVec // tokenwarden_api_key_tokens_total{api_key,outcome}
	KeyUsage     *prometheus.CounterVec // tokenwarden_api_key_usage_tokens_total{api_key,type}

	Allowance    *prometheus.GaugeVec // tokenwarden_budget_allowance_tokens{dimension,model,budget}
	KeyAllowance *prometheus.GaugeVec // tokenwarden_api_key_allowance_tokens{api_key,budget}
	Divisor      prometheus.Gauge     // tokenwarden_budget_division_replicas

	ConfigReloads    *prometheus.CounterVec // tokenwarden_config_reloads_total{result}
	ConfigGeneration prometheus.Gauge       // tokenwarden_config_generation
	ConfigInfo       *prometheus.GaugeVec   // tokenwarden_config_info{digest}
	ConfigLastReload prometheus.Gauge       // tokenwarden_config_last_reload_success_timestamp_seconds
	ConfigReloadTime prometheus.Gauge       // tokenwarden_config_last_reload_duration_seconds
	RestartRequired  prometheus.Gauge       // tokenwarden_config_restart_required

	RuleRequests     *prometheus.CounterVec // tokenwarden_rule_requests_total{rule,window,outcome}
	RuleWarnings     *prometheus.CounterVec // tokenwarden_rule_warnings_total{rule,window}
	RuleOverflow     *prometheus.CounterVec // tokenwarden_rule_attribute_overflow_total{rule,window}
	RuleAmount       *prometheus.CounterVec // tokenwarden_rule_amount_total{rule,window,outcome}
	RuleUsed         *prometheus.GaugeVec   // tokenwarden_rule_window_used_ratio{rule,window}
	RuleLimit        *prometheus.GaugeVec   // tokenwarden_rule_window_limit{rule,window,amount}
	RuleReset        *prometheus.GaugeVec   // tokenwarden_rule_window_reset_timestamp_seconds{rule,window}
	Spend            *prometheus.CounterVec // tokenwarden_spend_dollars_total{model}
	DurableRefusals  *prometheus.CounterVec // tokenwarden_durable_refusals_total{dimension}
	DurableFences    *prometheus.CounterVec // tokenwarden_durable_fenced_total{dimension}
	StoreChecks      *prometheus.GaugeVec   // tokenwarden_redis_store_check{check,result}
	BucketsInUse     *prometheus.GaugeVec   // tokenwarden_buckets{dimension,kind}
	BucketMapFullVec *prometheus.CounterVec // tokenwarden_bucket_map_full_total{dimension,kind}

	QueueLength     *prometheus.GaugeVec     // tokenwarden_queue_length{upstream,class}
	QueueWait       *prometheus.HistogramVec // tokenwarden_queue_wait_seconds{upstream,class}
	QueueDispatches *prometheus.CounterVec   // tokenwarden_queue_dispatches_total{upstream,class}
	QueueLeft       *prometheus.CounterVec   // tokenwarden_queue_left_total{upstream,class,reason}
	// Agents are the families of agents.go.
	Agents AgentMetrics

	// Pre-resolved children for the hot path.
	dimTokens    [budget.NumDimensions][budget.NumOutcomes]prometheus.Counter
	periodTokens [budget.NumDimensions][budget.NumKinds][budget.NumOutcomes]prometheus.Counter
	refusals     [budget.NumDimensions]prometheus.Counter
	periodRefuse [budget.NumDimensions][budget.NumKinds]prometheus.Counter
	reqRefusals  [budget.NumDimensions]prometheus.Counter
	mapFull      [budget.NumDimensions][budget.NumKinds]prometheus.Counter
	redisOps     [3]prometheus.Counter // reserve, refund, charge
	exceededTok  prometheus.Counter
	exceededReq  prometheus.Counter
	settled      prometheus.Counter
	released     prometheus.Counter

	mu          sync.Mutex
	configInfo  string
	keyCounters sync.Map // key name -> *[NumOutcomes]prometheus.Counter
	keyUsage    sync.Map // key name -> *[2]prometheus.Counter (input, output)
	modelUsage  sync.Map // model label -> *[2]prometheus.Counter (input, output)
	modelSpend  sync.Map // model -> prometheus.Counter
}

// New creates the families and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	dim := []string{"dimension"}
	m := &Metrics{
		TokenBudgetTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_token_budget_tokens_total",
			Help: "Tokens moved on token budgets by dimension and outcome (reserved, refunded, charged), counted once per dimension across its periods.",
		}, []string{"dimension", "outcome"}),
		TokenBudgetPeriodTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_token_budget_period_tokens_total",
			Help: "Tokens moved on token budgets by dimension, budget period (minute, day) and outcome.",
		}, []string{"dimension", "budget", "outcome"}),
		TokenBudgetRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_token_budget_refusals_total",
			Help: "Requests refused by a token budget, by the refusing dimension.",
		}, dim),
		TokenBudgetPeriodRefusal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_token_budget_period_refusals_total",
			Help: "Requests refused by a token budget, by the refusing dimension and period.",
		}, []string{"dimension", "budget"}),
		Exceeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_exceeded_total",
			Help: "Requests refused by any limit, by limit type (token_budget, requests).",
		}, []string{"limit_type"}),
		SkippedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_skipped_total",
			Help: "Dimensions skipped for a missing identity (token_budget_<dimension>), and buckets not created because their map was full (token_budget, token_budget_day, request_rate).",
		}, dim),
		RequestRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_request_refusals_total",
			Help: "Requests refused by a request-count limit, by dimension.",
		}, dim),
		RedisUnavailableVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limit_redis_unavailable_total",
			Help: "Admissions that found Redis unreachable, by dimension and action (fallback_memory, fallback_ledger, fail_closed).",
		}, []string{"dimension", "action"}),
		RedisPipelineDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tokenwarden_redis_pipeline_duration_seconds",
			Help:    "Time Redis took to answer a pipeline of budget operations, from sending it to the last reply.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}),
		RedisOperations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_redis_operations_total",
			Help: "Budget operations sent to Redis, by operation (reserve, refund, charge); several share a pipeline and a script call under load.",
		}, []string{"operation"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_requests_total",
			Help: "Requests answered by the proxy, by route and status code.",
		}, []string{"route", "code"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenwarden_request_duration_seconds",
			Help:    "Time from the request's arrival to the end of its response, by route.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"route"}),
		UpstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenwarden_upstream_duration_seconds",
			Help:    "Time from handing a request to the upstream (after any wait for its capacity) to the upstream's response headers, by upstream.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"upstream"}),
		UpstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_upstream_errors_total",
			Help: "Requests the upstream did not answer (connection refused, timeout), by upstream.",
		}, []string{"upstream"}),
		Usage: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_usage_tokens_total",
			Help: "Tokens the backends reported as used, by model and type (input, output).",
		}, []string{"model", "type"}),
		Settlements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_settlements_total",
			Help: "How holds ended: settled on reported usage, or released (error, non-2xx, cut stream, no usage).",
		}, []string{"result"}),
		KeyTokensVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_api_key_tokens_total",
			Help: "Tokens reserved, refunded and charged on the budgets of requests made with an API key, by key name.",
		}, []string{"api_key", "outcome"}),
		KeyUsage: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_api_key_usage_tokens_total",
			Help: "Tokens the backends reported for requests made with an API key, by key name and type (input, output).",
		}, []string{"api_key", "type"}),
		Allowance: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_budget_allowance_tokens",
			Help: "Token allowance this replica enforces, by dimension, model and budget period (after the division). Absent when unlimited.",
		}, []string{"dimension", "model", "budget"}),
		KeyAllowance: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_api_key_allowance_tokens",
			Help: "Token allowance of each API key's own budget (per_api_key, or the key's override) that this replica enforces, by key name and budget period. Absent when unlimited.",
		}, []string{"api_key", "budget"}),
		Divisor: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenwarden_budget_division_replicas",
			Help: "The budget division in force: each token allowance is divided by this number.",
		}),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_config_reloads_total",
			Help: "Config documents applied (success) or refused (failure; the last good config stays).",
		}, []string{"result"}),
		ConfigGeneration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenwarden_config_generation",
			Help: "The generation of the config in force, as written by the operator (0 for a standalone document).",
		}),
		ConfigInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_config_info",
			Help: "Always 1; the digest label is the first 12 hex digits of the SHA-256 of the config in force.",
		}, []string{"digest"}),
		ConfigLastReload: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenwarden_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last config applied.",
		}),
		ConfigReloadTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenwarden_config_last_reload_duration_seconds",
			Help: "How long the last config applied took to parse, validate and compile, in seconds.",
		}),
		RestartRequired: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenwarden_config_restart_required",
			Help: "1 while the config in force changed a setting that takes effect only at the next restart (listed in /admin/effective restart_required), else 0.",
		}),
		RuleRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_rule_requests_total",
			Help: "Requests a rule's window decided, by rule name, window (second, minute, hour, day, calendar_day, calendar_week, calendar_month, in_flight) and outcome (admitted, refused, warned).",
		}, []string{"rule", "window", "outcome"}),
		RuleWarnings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_rule_warnings_total",
			Help: "Requests a warn rule's window would have refused: admitted, taking nothing from it, with an x-tokenwarden-budget-warning header.",
		}, []string{"rule", "window"}),
		RuleOverflow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_rule_attribute_overflow_total",
			Help: "Requests a rule window counted in its overflow subject: their client-supplied count_by value (session, agent, task, run, request_fingerprint) came beyond the key's max_attribute_values distinct values in the window.",
		}, []string{"rule", "window"}),
		RuleAmount: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_rule_amount_total",
			Help: "Amounts moved on a rule's window, in the rule's units (tokens, requests or US dollars), by rule name, window and outcome (reserved, refunded, charged).",
		}, []string{"rule", "window", "outcome"}),
		RuleUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_rule_window_used_ratio",
			Help: "Share of a rule window's limit in use in the bucket the last request drew on, as the store reported it after the reservation or after the overage its settlement charged, or after a refund its level at the reservation with the refund back and what refilled since (the fleet's level in Redis): 0 full, 1 exhausted, above 1 in debt. An in_flight window's is the share of its limit in flight after the last request took or gave back a slot (the fleet's in Redis). A rule counted per subject reports its last request's subject: one series per rule window.",
		}, []string{"rule", "window"}),
		RuleLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_rule_window_limit",
			Help: "A rule window's limit per bucket in the rule's amount (tokens, input_tokens, output_tokens, requests, cost in US dollars, in_flight requests, never divided): the fleet total in Redis, this replica's share in memory.",
		}, []string{"rule", "window", "amount"}),
		RuleReset: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_rule_window_reset_timestamp_seconds",
			Help: "Unix time a calendar rule window resets (its current window's end); absent for rolling windows.",
		}, []string{"rule", "window"}),
		Spend: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_spend_dollars_total",
			Help: "US dollars the backends' reported usage costs at the models' prices, by model (priced models only).",
		}, []string{"model"}),
		DurableRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_durable_refusals_total",
			Help: "Requests answered 503 because a calendar or cost rule's counter could not be held (Redis unreachable, or a full bucket map): such a rule never fails open.",
		}, dim),
		DurableFences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_durable_fenced_total",
			Help: "Requests answered 503 budget_recovering because a calendar or cost rule's counters are fenced: Redis does not hold the epoch the replica runs under (it restarted without its data, or was flushed). See docs/runbooks.md.",
		}, dim),
		StoreChecks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_redis_store_check",
			Help: "1 for each check of the counters' Redis (maxmemory_policy, destructive_commands, cluster_full_coverage, evictions) at its last result (pass, fail, skipped: no permission to check), 0 for the others. See docs/redis.md.",
		}, []string{"check", "result"}),
		BucketsInUse: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_buckets",
			Help: "Buckets held in this replica's memory, by dimension and kind (requests, minute, day); max_buckets bounds each.",
		}, []string{"dimension", "kind"}),
		BucketMapFullVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_bucket_map_full_total",
			Help: "Buckets not created because the map of their dimension and kind was at max_buckets: the request was admitted on that bucket without charge (also counted in rate_limit_skipped_total).",
		}, []string{"dimension", "kind"}),
		QueueLength: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokenwarden_queue_length",
			Help: "Requests waiting for an upstream's capacity, by upstream and priority class.",
		}, []string{"upstream", "class"}),
		QueueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenwarden_queue_wait_seconds",
			Help:    "Time a request waited for an upstream's capacity before it was forwarded, by upstream and priority class (a request that did not wait is observed at 0).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 5, 10, 30, 60},
		}, []string{"upstream", "class"}),
		QueueDispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_queue_dispatches_total",
			Help: "Requests forwarded after waiting for an upstream's capacity, by upstream and priority class.",
		}, []string{"upstream", "class"}),
		QueueLeft: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_queue_left_total",
			Help: "Requests that left an upstream's queue without being forwarded, by upstream, priority class and reason (queue_timeout, queue_full, canceled).",
		}, []string{"upstream", "class", "reason"}),
	}
	reg.MustRegister(m.TokenBudgetTokens, m.TokenBudgetPeriodTokens, m.TokenBudgetRefusals, m.TokenBudgetPeriodRefusal,
		m.Exceeded, m.SkippedVec, m.RequestRefusals, m.RedisUnavailableVec, m.RedisPipelineDuration, m.RedisOperations, m.Requests, m.RequestDuration, m.UpstreamDuration,
		m.UpstreamErrors, m.Usage, m.Settlements, m.KeyTokensVec, m.KeyUsage, m.Allowance, m.KeyAllowance, m.Divisor, m.ConfigReloads,
		m.ConfigGeneration, m.ConfigInfo, m.ConfigLastReload, m.ConfigReloadTime, m.RestartRequired, m.BucketsInUse, m.BucketMapFullVec,
		m.RuleRequests, m.RuleWarnings, m.RuleOverflow, m.RuleAmount, m.RuleUsed, m.RuleLimit, m.RuleReset, m.Spend, m.DurableRefusals, m.DurableFences,
		m.StoreChecks, m.QueueLength, m.QueueWait, m.QueueDispatches, m.QueueLeft)
	m.Agents.register(reg)
	m.Observability = newObservability(reg)
	m.Cache = newCache(reg)
	m.RedisShared = newRedisShared(reg)

	for d := budget.Dimension(0); d < budget.NumDimensions; d++ {
		ds := d.String()
		for o := budget.Outcome(0); o < budget.NumOutcomes; o++ {
			m.dimTokens[d][o] = m.TokenBudgetTokens.WithLabelValues(ds, o.String())
			for _, k := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
				m.periodTokens[d][k][o] = m.TokenBudgetPeriodTokens.WithLabelValues(ds, k.String(), o.String())
			}
		}
		for k := budget.Requests; k <= budget.TokensDay; k++ {
			m.mapFull[d][k] = m.BucketMapFullVec.WithLabelValues(ds, k.String())
		}
		m.refusals[d] = m.TokenBudgetRefusals.WithLabelValues(ds)
		m.reqRefusals[d] = m.RequestRefusals.WithLabelValues(ds)
		for _, k := range []budget.Kind{budget.TokensMinute, budget.TokensDay} {
			m.periodRefuse[d][k] = m.TokenBudgetPeriodRefusal.WithLabelValues(ds, k.String())
		}
	}
	m.exceededTok = m.Exceeded.WithLabelValues("token_budget")
	m.exceededReq = m.Exceeded.WithLabelValues("requests")
	for i, op := range []string{"reserve", "refund", "charge"} {
		m.redisOps[i] = m.RedisOperations.WithLabelValues(op)
	}
	m.Providers = newProviders(reg)
	m.settled = m.Settlements.WithLabelValues("settled")
	m.released = m.Settlements.WithLabelValues("released")
	for _, r := range []string{"success", "failure"} {
		m.ConfigReloads.WithLabelValues(r)
	}
	return m
}

// DimensionTokens implements budget.Recorder.
func (m *Metrics) DimensionTokens(d budget.Dimension, o budget.Outcome, n float64) {
	m.dimTokens[d][o].Add(n)
}

// PeriodTokens implements budget.Recorder.
func (m *Metrics) PeriodTokens(d budget.Dimension, k budget.Kind, o budget.Outcome, n float64) {
	m.periodTokens[d][k][o].Add(n)
}

// TokenRefusal implements budget.Recorder.
func (m *Metrics) TokenRefusal(d budget.Dimension, k budget.Kind) {
	m.refusals[d].Inc()
	m.periodRefuse[d][k].Inc()
	m.exceededTok.Inc()
}

// RequestRefusal implements budget.Recorder.
func (m *Metrics) RequestRefusal(d budget.Dimension) {
	m.reqRefusals[d].Inc()
	m.exceededReq.Inc()
}

// Skipped implements budget.Recorder.
func (m *Metrics) Skipped(label string) { m.SkippedVec.WithLabelValues(label).Inc() }

// BucketMapFull implements budget.Recorder.
func (m *Metrics) BucketMapFull(d budget.Dimension, k budget.Kind) {
	switch {
	case d >= budget.NumDimensions || k >= budget.NumKinds:
	case m.mapFull[d][k] != nil:
		m.mapFull[d][k].Inc()
	default:
		// A rule's map: its series appears with its first full map.
		m.BucketMapFullVec.WithLabelValues(d.String(), k.String()).Inc()
	}
}

// KeyTokens implements budget.Recorder.
func (m *Metrics) KeyTokens(key string, o budget.Outcome, n float64) {
	c, ok := m.keyCounters.Load(key)
	if !ok {
		var cs [budget.NumOutcomes]prometheus.Counter
		for i := budget.Outcome(0); i < budget.NumOutcomes; i++ {
			cs[i] = m.KeyTokensVec.WithLabelValues(key, i.String())
		}
		c, _ = m.keyCounters.LoadOrStore(key, &cs)
	}
	c.(*[budget.NumOutcomes]prometheus.Counter)[o].Add(n)
}

// RedisPipeline implements budget.Recorder.
func (m *Metrics) RedisPipeline(d time.Duration, reservations, refunds, charges int) {
	m.RedisPipelineDuration.Observe(d.Seconds())
	for i, n := range [3]int{reservations, refunds, charges} {
		if n > 0 {
			m.redisOps[i].Add(float64(n))
		}
	}
}

// Rule implements budget.Recorder: one rule window's series, resolved once.
func (m *Metrics) Rule(rule, window string) budget.RuleRecorder {
	r := &ruleMetrics{
		warnings: m.RuleWarnings.WithLabelValues(rule, window),
		overflow: m.RuleOverflow.MustCurryWith(prometheus.Labels{"rule": rule, "window": window}),
		used:     m.RuleUsed.WithLabelValues(rule, window),
		limitVec: m.RuleLimit,
		resetVec: m.RuleReset,
		rule:     rule,
		window:   window,
	}
	for o := budget.RuleOutcome(0); o < budget.NumRuleOutcomes; o++ {
		r.decisions[o] = m.RuleRequests.WithLabelValues(rule, window, o.String())
	}
	for o := budget.Outcome(0); o < budget.NumOutcomes; o++ {
		r.amounts[o] = m.RuleAmount.WithLabelValues(rule, window, o.String())
	}
	return r
}

// ForgetRules drops the series of rules no longer configured.
func (m *Metrics) ForgetRules(keep func(rule string) bool) {
	for _, vec := range []interface {
		prometheus.Collector
		DeletePartialMatch(prometheus.Labels) int
	}{m.RuleRequests, m.RuleWarnings, m.RuleOverflow, m.RuleAmount, m.RuleUsed, m.RuleLimit, m.RuleReset} {
		labels := map[string]bool{}
		metrics := make(chan prometheus.Metric, 64)
		go func() { vec.Collect(metrics); close(metrics) }()
		for mt := range metrics {
			var pb dto.Metric
			if mt.Write(&pb) == nil {
				for _, lp := range pb.GetLabel() {
					if lp.GetName() == "rule" {
						labels[lp.GetValue()] = true
					}
				}
			}
		}
		for rule := range labels {
			if !keep(rule) {
				vec.DeletePartialMatch(prometheus.Labels{"rule": rule})
			}
		}
	}
}

type ruleMetrics struct {
	decisions [budget.NumRuleOutcomes]prometheus.Counter
	amounts   [budget.NumOutcomes]prometheus.Counter
	warnings  prometheus.Counter
	// overflow is resolved at the first overflow, so a rule without one has no series.
	overflow *prometheus.CounterVec
	used     prometheus.Gauge
	// limit is resolved at the window's first level, when its amount is known; reset
	// at a calendar window's first level, so a rolling window has no reset series.
	limitVec, resetVec *prometheus.GaugeVec
	limit, reset       atomic.Pointer[prometheus.Gauge]
	rule, window       string
}

func (r *ruleMetrics) Decision(o budget.RuleOutcome) {
	r.decisions[o].Inc()
	if o == budget.RuleWarned {
		r.warnings.Inc()
	}
}

func (r *ruleMetrics) Amount(o budget.Outcome, n float64) { r.amounts[o].Add(n) }

func (r *ruleMetrics) Overflowed() { r.overflow.WithLabelValues().Inc() }

func (r *ruleMetrics) Level(used, limit float64, amount budget.Amount, reset time.Time) {
	r.used.Set(used)
	resolve(&r.limit, r.limitVec, r.rule, r.window, amount.String()).Set(limit)
	if !reset.IsZero() {
		resolve(&r.reset, r.resetVec, r.rule, r.window).Set(float64(reset.UnixMilli()) / 1000)
	}
}

// resolve is the child of vec with these labels, looked up once.
func resolve(p *atomic.Pointer[prometheus.Gauge], vec *prometheus.GaugeVec, labels ...string) prometheus.Gauge {
	if g := p.Load(); g != nil {
		return *g
	}
	g := vec.WithLabelValues(labels...)
	p.Store(&g)
	return g
}

// DurableRefused implements budget.Recorder.
func (m *Metrics) DurableRefused(d budget.Dimension) {
	m.DurableRefusals.WithLabelValues(d.String()).Inc()
}

// DurableFenced implements budget.FenceRecorder.
func (m *Metrics) DurableFenced(d budget.Dimension) {
	m.DurableFences.WithLabelValues(d.String()).Inc()
}

// StoreCheck implements redisstore's check recorder: check's gauge is 1 at result and
// 0 at the other results.
func (m *Metrics) StoreCheck(check, result string) {
	for _, r := range []string{"pass", "fail", "skipped"} {
		v := 0.0
		if r == result {
			v = 1
		}
		m.StoreChecks.WithLabelValues(check, r).Set(v)
	}
}

// RedisUnavailable implements budget.Recorder.
func (m *Metrics) RedisUnavailable(d budget.Dimension, action string) {
	m.RedisUnavailableVec.WithLabelValues(d.String(), action).Inc()
}

// ForgetKeys drops the series of API keys no longer configured, so a deleted key's
// series ends.
func (m *Metrics) ForgetKeys(keep func(name string) bool) {
	forget := func(k, _ any) bool {
		name := k.(string)
		if !keep(name) {
			m.keyCounters.Delete(name)
			m.keyUsage.Delete(name)
			m.KeyTokensVec.DeletePartialMatch(prometheus.Labels{"api_key": name})
			m.KeyUsage.DeletePartialMatch(prometheus.Labels{"api_key": name})
		}
		return true
	}
	m.keyCounters.Range(forget)
	m.keyUsage.Range(forget)
}

// Settled counts a reservation settled on the usage the backend reported.
func (m *Metrics) Settled() { m.settled.Inc() }

// Released counts a reservation released whole.
func (m *Metrics) Released() { m.released.Inc() }

// AddUsage counts the tokens the backend reported by model label and, when key is
// not empty, by API key. The children are looked up once per label value.
func (m *Metrics) AddUsage(model, key string, input, output int64) {
	c := pair(&m.modelUsage, m.Usage, model)
	c[0].Add(float64(input))
	c[1].Add(float64(output))
	if key != "" {
		c = pair(&m.keyUsage, m.KeyUsage, key)
		c[0].Add(float64(input))
		c[1].Add(float64(output))
	}
}

// pair is the input and output children of vec for label, cached in cache.
func pair(cache *sync.Map, vec *prometheus.CounterVec, label string) *[2]prometheus.Counter {
	if c, ok := cache.Load(label); ok {
		return c.(*[2]prometheus.Counter)
	}
	c := &[2]prometheus.Counter{vec.WithLabelValues(label, "input"), vec.WithLabelValues(label, "output")}
	v, _ := cache.LoadOrStore(label, c)
	return v.(*[2]prometheus.Counter)
}

// AddSpend counts the US dollars a request to a priced model cost.
func (m *Metrics) AddSpend(model string, dollars float64) {
	c, ok := m.modelSpend.Load(model)
	if !ok {
		c, _ = m.modelSpend.LoadOrStore(model, m.Spend.WithLabelValues(model))
	}
	c.(prometheus.Counter).Add(dollars)
}

// SetConfig records the config in force.
func (m *Metrics) SetConfig(generation int64, digest string, unixSeconds float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(digest) > 12 {
		digest = digest[:12]
	}
	if m.configInfo != "" && m.configInfo != digest {
		m.ConfigInfo.DeleteLabelValues(m.configInfo)
	}
	m.configInfo = digest
	m.ConfigInfo.WithLabelValues(digest).Set(1)
	m.ConfigGeneration.Set(float64(generation))
	m.ConfigLastReload.Set(unixSeconds)
	m.ConfigReloads.WithLabelValues("success").Inc()
}

// SetAllowances publishes the allowances in force, replacing the previous set.
func (m *Metrics) SetAllowances(divisor int64, eff []budget.Effective) {
	m.Allowance.Reset()
	m.KeyAllowance.Reset()
	m.Divisor.Set(float64(divisor))
	for _, e := range eff {
		set := func(budget string, v *int64) {
			if v == nil {
				return
			}
			if e.Key != "" {
				m.KeyAllowance.WithLabelValues(e.Key, budget).Set(float64(*v))
			} else {
				m.Allowance.WithLabelValues(e.Dimension, e.Model, budget).Set(float64(*v))
			}
		}
		set("minute", e.TokensPerMinute)
		set("day", e.TokensPerDay)
	}
}

// Code turns a status code into its label value; those of HTTP's range are made once,
// as every request's answer is counted by its code.
func Code(code int) string {
	if code >= 100 && code < 100+len(codes) {
		return codes[code-100]
	}
	return strconv.Itoa(code)
}

// codes are the label values of the status codes 100 to 599.
var codes = func() (c [500]string) {
	for i := range c {
		c[i] = strconv.Itoa(100 + i)
	}
	return c
}()

// QueueObserver returns the observer of one upstream's scheduler: it keeps the queue
// families of that upstream, its children resolved once.
func (m *Metrics) QueueObserver(upstream string) schedule.Observer {
	o := &queueObserver{}
	for _, c := range schedule.Classes {
		cs := c.String()
		o.length[c] = m.QueueLength.WithLabelValues(upstream, cs)
		o.wait[c] = m.QueueWait.WithLabelValues(upstream, cs)
		o.dispatched[c] = m.QueueDispatches.WithLabelValues(upstream, cs)
		o.left[c] = m.QueueLeft.MustCurryWith(prometheus.Labels{"upstream": upstream, "class": cs})
	}
	return o
}

// ForgetUpstreams drops the queue series of upstreams keep reports false for.
func (m *Metrics) ForgetUpstreams(keep func(name string) bool) {
	for _, v := range []deleter{m.QueueLength, m.QueueWait, m.QueueDispatches, m.QueueLeft} {
		forgetBy(v, "upstream", keep)
	}
}

type deleter interface {
	prometheus.Collector
	DeletePartialMatch(prometheus.Labels) int
}

// forgetBy deletes the series of vec whose label's value keep reports false for.
func forgetBy(vec deleter, label string, keep func(string) bool) {
	values := map[string]bool{}
	metrics := make(chan prometheus.Metric, 64)
	go func() { vec.Collect(metrics); close(metrics) }()
	for mt := range metrics {
		var pb dto.Metric
		if mt.Write(&pb) == nil {
			for _, lp := range pb.GetLabel() {
				if lp.GetName() == label {
					values[lp.GetValue()] = true
				}
			}
		}
	}
	for v := range values {
		if !keep(v) {
			vec.DeletePartialMatch(prometheus.Labels{label: v})
		}
	}
}

type queueObserver struct {
	length     [len(schedule.Classes)]prometheus.Gauge
	wait       [len(schedule.Classes)]prometheus.Observer
	dispatched [len(schedule.Classes)]prometheus.Counter
	left       [len(schedule.Classes)]*prometheus.CounterVec
}

func (o *queueObserver) Queued(c schedule.Class, n int) { o.length[c].Set(float64(n)) }

// Started observes a request that did not wait at 0 in the wait histogram, so that
// its quantiles are those of every request forwarded through the scheduler.
func (o *queueObserver) Started(c schedule.Class) { o.wait[c].Observe(0) }

func (o *queueObserver) Dispatched(c schedule.Class, wait time.Duration) {
	o.dispatched[c].Inc()
	o.wait[c].Observe(wait.Seconds())
}

func (o *queueObserver) Left(c schedule.Class, reason string, _ time.Duration) {
	o.left[c].WithLabelValues(reason).Inc()
}
