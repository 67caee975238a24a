// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// The API server refuses a bad object with a message naming the field, and stores
// nothing.
var _ = Describe("Validation by the API server", func() {
	var ns string
	BeforeEach(func() {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"}}
		Expect(k8sClient.Create(ctx, n)).To(Succeed())
		ns = n.Name
	})

	refused := func(obj client.Object, message string) {
		GinkgoHelper()
		obj.SetNamespace(ns)
		obj.SetName("bad")
		err := k8sClient.Create(ctx, obj)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring(message))
		Expect(apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj))).To(BeTrue(), "nothing is stored")
	}

	budget := func(mutate func(*twv1alpha1.TokenBudgetSpec)) *twv1alpha1.TokenBudget {
		b := &twv1alpha1.TokenBudget{Spec: twv1alpha1.TokenBudgetSpec{
			ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, Dimension: twv1alpha1.DimensionGlobal, TokensPerMinute: 1000,
		}}
		mutate(&b.Spec)
		return b
	}
	proxy := func(mutate func(*twv1alpha1.TokenProxySpec)) *twv1alpha1.TokenProxy {
		p := &twv1alpha1.TokenProxy{Spec: twv1alpha1.TokenProxySpec{
			Upstreams: []twv1alpha1.Upstream{{Name: "default", URL: "http://llm:8000"}},
		}}
		mutate(&p.Spec)
		return p
	}

	DescribeTable("a TokenBudget",
		func(mutate func(*twv1alpha1.TokenBudgetSpec), message string) { refused(budget(mutate), message) },
		Entry("PerModel without a model",
			func(s *twv1alpha1.TokenBudgetSpec) { s.Dimension = twv1alpha1.DimensionPerModel },
			"spec: Invalid value: model is required when dimension is PerModel and must not be set otherwise"),
		Entry("a model on another dimension",
			func(s *twv1alpha1.TokenBudgetSpec) { s.Model = "gpt-4o" },
			"model is required when dimension is PerModel and must not be set otherwise"),
		Entry("an unknown dimension",
			func(s *twv1alpha1.TokenBudgetSpec) { s.Dimension = "PerOrganization" },
			`spec.dimension: Unsupported value: "PerOrganization"`),
		Entry("a negative budget",
			func(s *twv1alpha1.TokenBudgetSpec) { s.TokensPerDay = -1 },
			"spec.tokensPerDay: Invalid value: -1: spec.tokensPerDay in body should be greater than or equal to 0"),
		Entry("no limit at all",
			func(s *twv1alpha1.TokenBudgetSpec) { s.TokensPerMinute = 0 },
			"at least one of tokensPerMinute, tokensPerDay and requestsPerSecond must be positive"),
		Entry("a burst without a rate",
			func(s *twv1alpha1.TokenBudgetSpec) { s.BurstCapacity = 10 },
			"burstCapacity needs requestsPerSecond"),
		Entry("no proxy",
			func(s *twv1alpha1.TokenBudgetSpec) { s.ProxyRef.Name = "" },
			"spec.proxyRef.name: Invalid value: \"\": spec.proxyRef.name in body should be at least 1 chars long"),
	)

	// A budget in the rule shape: a minute window of tokens for each team, then the
	// mutation.
	ruled := func(mutate func(*twv1alpha1.TokenBudgetSpec)) func(*twv1alpha1.TokenBudgetSpec) {
		return func(s *twv1alpha1.TokenBudgetSpec) {
			s.Dimension, s.TokensPerMinute = twv1alpha1.DimensionPerTeam, 0
			s.Windows = windows(rollingWindow("600k", twv1alpha1.PeriodMinute, 0))
			mutate(s)
		}
	}
	calendar := func(c twv1alpha1.CalendarWindow) func(*twv1alpha1.TokenBudgetSpec) {
		return ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Windows = windows(calendarWindow("1M", c)) })
	}
	DescribeTable("a TokenBudget in the rule shape",
		func(mutate func(*twv1alpha1.TokenBudgetSpec), message string) { refused(budget(mutate), message) },
		Entry("a shorthand minute beside windows",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.TokensPerMinute = 1000 }),
			"tokensPerMinute must be 0 when windows are set: write the minute as a window"),
		Entry("a shorthand day beside windows",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.TokensPerDay = 1000 }),
			"tokensPerDay must be 0 when windows are set: write the day as a window"),
		Entry("a shorthand request rate beside windows",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.RequestsPerSecond = 10 }),
			"requestsPerSecond must be 0 when windows are set: write a Requests budget with a window"),
		Entry("a window both rolling and calendar",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Windows[0].Calendar = &twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryDay}
			}),
			"spec.windows[0]: Invalid value: set exactly one of rolling and calendar"),
		Entry("a window neither rolling nor calendar",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Windows[0].Rolling = nil }),
			"spec.windows: Invalid value: windows[] must each set rolling or calendar: only an InFlight budget's window is its limit alone"),
		Entry("an InFlight budget with a period",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount, s.CountBy = twv1alpha1.AmountInFlight, twv1alpha1.CountBySession
			}),
			"spec.windows: Invalid value: amount InFlight needs windows of one entry, its limit alone (no rolling, no calendar)"),
		Entry("an InFlight budget of two windows",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount = twv1alpha1.AmountInFlight
				s.Windows = windows(twv1alpha1.BudgetWindow{Limit: resource.MustParse("2")}, twv1alpha1.BudgetWindow{Limit: resource.MustParse("3")})
			}),
			"amount InFlight needs windows of one entry"),
		Entry("an InFlight budget that warns",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount, s.Action = twv1alpha1.AmountInFlight, twv1alpha1.ActionWarn
				s.Windows = windows(twv1alpha1.BudgetWindow{Limit: resource.MustParse("2")})
			}),
			"spec.action: Invalid value: amount InFlight blocks: action Warn is not supported for it"),
		Entry("a fraction of a request in flight",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount = twv1alpha1.AmountInFlight
				s.Windows = windows(twv1alpha1.BudgetWindow{Limit: resource.MustParse("1.5")})
			}),
			"windows[].limit must be a whole number of tokens or requests"),
		Entry("a limit of 0",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Windows[0].Limit = resource.MustParse("0") }),
			"spec.windows[0]: Invalid value: limit must be above 0"),
		Entry("a negative limit",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Windows[0].Limit = resource.MustParse("-5") }),
			"limit must be above 0"),
		Entry("a fraction of a token",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Windows[0].Limit = resource.MustParse("25.50") }),
			"windows[].limit must be a whole number of tokens or requests: only a Cost budget (US dollars) counts fractions"),
		Entry("a fraction of a request",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount, s.Windows[0].Limit = twv1alpha1.AmountRequests, resource.MustParse("1.5")
			}),
			"windows[].limit must be a whole number"),
		Entry("no windows, nor a shorthand limit",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Windows = nil }),
			"at least one of tokensPerMinute, tokensPerDay and requestsPerSecond must be positive, or windows set"),
		Entry("an unknown period",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Windows[0].Rolling.Period = "Fortnight" }),
			`spec.windows[0].rolling.period: Unsupported value: "Fortnight"`),
		Entry("a burst longer than a month",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Windows[0].Rolling.BurstSeconds = 2678401 }),
			"spec.windows[0].rolling.burstSeconds: Invalid value: 2678401"),
		Entry("an unknown calendar unit",
			calendar(twv1alpha1.CalendarWindow{Every: "Year"}),
			`spec.windows[0].calendar.every: Unsupported value: "Year"`),
		Entry("a weekday on a monthly window",
			calendar(twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth, Weekday: "Friday"}),
			"spec.windows[0].calendar: Invalid value: weekday applies only to every: Week"),
		Entry("a day of the month on a weekly window",
			calendar(twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryWeek, DayOfMonth: 15}),
			"spec.windows[0].calendar: Invalid value: dayOfMonth applies only to every: Month"),
		Entry("the 32nd of a month",
			calendar(twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth, DayOfMonth: 32}),
			"spec.windows[0].calendar.dayOfMonth: Invalid value: 32"),
		Entry("an unknown weekday",
			calendar(twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryWeek, Weekday: "Funday"}),
			`spec.windows[0].calendar.weekday: Unsupported value: "Funday"`),
		Entry("a time zone that is no IANA name",
			calendar(twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryDay, TimeZone: "Berlin time"}),
			`spec.windows[0].calendar.timeZone: Invalid value: "Berlin time": timeZone must be an IANA time zone name such as UTC or Europe/Berlin`),
		Entry("a time of day past midnight",
			calendar(twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryDay, At: "24:00"}),
			`spec.windows[0].calendar.at: Invalid value: "24:00": at must be a time of day HH:MM, such as 00:00 or 09:30`),
		Entry("subjects on a Global budget",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Dimension, s.Subjects = twv1alpha1.DimensionGlobal, []string{"research"}
			}),
			"subjects must not be set on a Global budget: it has one subject, the whole fleet"),
		Entry("an empty subject",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Subjects = []string{""} }),
			"spec.subjects[0]: Invalid value: \"\": spec.subjects[0] in body should be at least 1 chars long"),
		Entry("a fan-out by its own dimension",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.CountBy = twv1alpha1.CountByTeam }),
			"countBy must differ from the dimension: the budget already counts each subject of its dimension"),
		Entry("an unknown fan-out",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.CountBy = "Conversation" }),
			`spec.countBy: Unsupported value: "Conversation"`),
		Entry("an unknown amount",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Amount = "Dollars" }),
			`spec.amount: Unsupported value: "Dollars"`),
		Entry("an unknown action",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Action = "Throttle" }),
			`spec.action: Unsupported value: "Throttle"`),
		Entry("a shorthand token budget counting requests",
			func(s *twv1alpha1.TokenBudgetSpec) { s.Amount = twv1alpha1.AmountRequests },
			"tokensPerMinute and tokensPerDay count tokens: a Requests or Cost budget writes its limits in windows"),
		Entry("a cost budget without windows",
			func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount, s.TokensPerMinute, s.RequestsPerSecond = twv1alpha1.AmountCost, 0, 10
			},
			"amount needs windows (or, for InputTokens and OutputTokens, tokensPerMinute or tokensPerDay): requestsPerSecond counts requests only"),
		Entry("a PerModel budget with a model and subjects",
			ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Dimension, s.Model, s.Subjects = twv1alpha1.DimensionPerModel, "gpt-4o", []string{"o3"}
			}),
			"model is required when dimension is PerModel and must not be set otherwise"),
		Entry("a PerModel budget of the limits shape for each model",
			func(s *twv1alpha1.TokenBudgetSpec) { s.Dimension = twv1alpha1.DimensionPerModel },
			"model is required when dimension is PerModel"),
	)

	It("stores rule-shaped budgets with quantities, dollars and subjects instead of a model", func() {
		for name, mutate := range map[string]func(*twv1alpha1.TokenBudgetSpec){
			"dollars": ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount = twv1alpha1.AmountCost
				s.Windows = windows(calendarWindow("25.50", twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryMonth, DayOfMonth: 31, TimeZone: "America/Argentina/Buenos_Aires", At: "09:30"}))
			}),
			"models": ruled(func(s *twv1alpha1.TokenBudgetSpec) {
				s.Dimension, s.Subjects = twv1alpha1.DimensionPerModel, []string{"gpt-4o", "o3"}
			}),
			"each-model": ruled(func(s *twv1alpha1.TokenBudgetSpec) { s.Dimension = twv1alpha1.DimensionPerModel }),
			"weekly":     calendar(twv1alpha1.CalendarWindow{Every: twv1alpha1.EveryWeek, Weekday: twv1alpha1.Weekday("Sunday")}),
			"input-shorthand": func(s *twv1alpha1.TokenBudgetSpec) {
				s.Amount, s.CountBy, s.Dimension = twv1alpha1.AmountInputTokens, twv1alpha1.CountByModel, twv1alpha1.DimensionPerAPIKey
			},
		} {
			b := budget(mutate)
			b.Name, b.Namespace = name, ns
			Expect(k8sClient.Create(ctx, b)).To(Succeed(), name)
		}
	})

	DescribeTable("a TokenProxy",
		func(mutate func(*twv1alpha1.TokenProxySpec), message string) { refused(proxy(mutate), message) },
		Entry("allowed namespaces from a Selector without a selector",
			func(s *twv1alpha1.TokenProxySpec) { s.AllowedNamespaces.From = twv1alpha1.NamespacesFromSelector },
			"spec.allowedNamespaces: Invalid value: selector is required when from is Selector and must not be set otherwise"),
		Entry("a namespace selector with from: All",
			func(s *twv1alpha1.TokenProxySpec) {
				s.AllowedNamespaces = twv1alpha1.AllowedNamespaces{From: twv1alpha1.NamespacesFromAll, Selector: &metav1.LabelSelector{}}
			},
			"selector is required when from is Selector and must not be set otherwise"),
		Entry("an unknown bypass policy",
			func(s *twv1alpha1.TokenProxySpec) { s.AllowBypass = "Always" },
			`spec.allowBypass: Unsupported value: "Always"`),
		Entry("ServiceMonitor settings without a ServiceMonitor",
			func(s *twv1alpha1.TokenProxySpec) {
				s.ServiceMonitorSpec = &twv1alpha1.ServiceMonitorSpec{Interval: "30s"}
			},
			"serviceMonitorSpec needs serviceMonitor: true"),
		Entry("a ServiceMonitor interval that is no Prometheus duration",
			func(s *twv1alpha1.TokenProxySpec) {
				s.ServiceMonitor, s.ServiceMonitorSpec = true, &twv1alpha1.ServiceMonitorSpec{Interval: "30 seconds"}
			},
			"spec.serviceMonitorSpec.interval"),
		Entry("a ledger spool below 1Mi",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Ledger = &twv1alpha1.LedgerSpec{SpoolSize: ptr.To(resource.MustParse("512Ki"))}
			},
			"spoolSize must be at least 1Mi"),
		Entry("a ledger flushed once an hour",
			func(s *twv1alpha1.TokenProxySpec) { s.Ledger = &twv1alpha1.LedgerSpec{FlushIntervalSeconds: 3600} },
			"spec.ledger.flushIntervalSeconds"),
		Entry("an unknown spool policy",
			func(s *twv1alpha1.TokenProxySpec) { s.Ledger = &twv1alpha1.LedgerSpec{WhenSpoolFull: "Block"} },
			`spec.ledger.whenSpoolFull: Unsupported value: "Block"`),
		Entry("no upstream",
			func(s *twv1alpha1.TokenProxySpec) { s.Upstreams = nil },
			"spec.upstreams: Required value"),
		Entry("an upstream URL without a scheme",
			func(s *twv1alpha1.TokenProxySpec) { s.Upstreams[0].URL = "llm:8000" },
			`spec.upstreams[0].url: Invalid value: "llm:8000": url must start with http:// or https://`),
		Entry("an upstream URL without a host",
			func(s *twv1alpha1.TokenProxySpec) { s.Upstreams[0].URL = "http://" },
			`spec.upstreams[0].url: Invalid value: "http://": url must name a host, as in http://host:port`),
		Entry("a model listed by two upstreams",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Upstreams = []twv1alpha1.Upstream{
					{Name: "a", URL: "http://a:8000", Models: []string{"gpt-4o", "gpt-4o-mini"}},
					{Name: "b", URL: "http://b:8000", Models: []string{"o3", "gpt-4o"}},
				}
			},
			`spec.upstreams: Invalid value: a model is listed by two upstreams; list each model under one upstream only`),
		Entry("two upstreams with one name",
			func(s *twv1alpha1.TokenProxySpec) { s.Upstreams = append(s.Upstreams, s.Upstreams[0]) },
			`spec.upstreams[1]: Duplicate value: {"name":"default"}`),
		Entry("Redis storage without Redis",
			func(s *twv1alpha1.TokenProxySpec) { s.Storage.Type = twv1alpha1.StorageRedis },
			"spec.storage: Invalid value: redis is required when type is Redis and must not be set otherwise"),
		Entry("a Redis URL of another scheme",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Storage = twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &twv1alpha1.RedisSpec{URL: "redis-sentinel://h:26379"}}
			},
			`spec.storage.redis.url: Invalid value: "redis-sentinel://h:26379": url must start with redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://`),
		Entry("a Sentinel URL without the master's name",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Storage = twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &twv1alpha1.RedisSpec{URL: "redis+sentinel://s1:26379,s2:26379"}}
			},
			`spec.storage.redis.url: Invalid value: "redis+sentinel://s1:26379,s2:26379": a redis+sentinel:// url names the master after the sentinels`),
		Entry("a sentinel password for a cluster",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Storage = twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &twv1alpha1.RedisSpec{URL: "redis+cluster://a:7000,b:7001",
					SentinelPasswordSecretRef: &twv1alpha1.SecretKeyReference{Name: "s"}}}
			},
			`spec.storage: Invalid value: redis.sentinelPasswordSecretRef needs a redis+sentinel:// url`),
		Entry("a whitelist entry that is not a CIDR",
			func(s *twv1alpha1.TokenProxySpec) { s.Whitelist = []string{"10.0.0.0/33"} },
			`spec.whitelist[0]: Invalid value: "10.0.0.0/33": must be a CIDR or an IP address`),
		Entry("an unknown auth mode",
			func(s *twv1alpha1.TokenProxySpec) { s.Auth.Mode = "Sometimes" },
			`spec.auth.mode: Unsupported value: "Sometimes"`),
		Entry("an unknown overage rule",
			func(s *twv1alpha1.TokenProxySpec) { s.Overage = "Waive" },
			`spec.overage: Unsupported value: "Waive"`),
		Entry("an IPv6 prefix longer than an address",
			func(s *twv1alpha1.TokenProxySpec) { s.ClientIPv6PrefixLength = 129 },
			"spec.clientIPv6PrefixLength: Invalid value: 129: spec.clientIPv6PrefixLength in body should be less than or equal to 128"),
		Entry("no retry patience at all",
			func(s *twv1alpha1.TokenProxySpec) { s.RetryPatienceSeconds = -1 },
			"spec.retryPatienceSeconds: Invalid value: -1: spec.retryPatienceSeconds in body should be greater than or equal to 1"),
		Entry("a cached input weight above 1",
			func(s *twv1alpha1.TokenProxySpec) { s.CachedInputWeight = ptr.To(resource.MustParse("1.5")) },
			`spec.cachedInputWeight: Invalid value: "1500m": cachedInputWeight must be from 0 to 1`),
		Entry("a negative cached input weight",
			func(s *twv1alpha1.TokenProxySpec) { s.CachedInputWeight = ptr.To(resource.MustParse("-0.1")) },
			"cachedInputWeight must be from 0 to 1"),
		Entry("two models of one name",
			func(s *twv1alpha1.TokenProxySpec) {
				s.Models = []twv1alpha1.ModelSpec{{Name: "gpt-4o"}, {Name: "gpt-4o"}}
			},
			`spec.models[1]: Duplicate value: {"name":"gpt-4o"}`),
		Entry("negative replicas",
			func(s *twv1alpha1.TokenProxySpec) { s.Replicas = ptr.To(int32(-1)) },
			"spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"),
	)

	DescribeTable("a TokenProxy whose name cannot name its Services",
		func(name string) {
			p := proxy(func(*twv1alpha1.TokenProxySpec) {})
			p.Name, p.Namespace = name, ns
			err := k8sClient.Create(ctx, p)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected Invalid, got %v", err)
			Expect(err.Error()).To(ContainSubstring("<nil>: Invalid value: metadata.name must be a DNS label of at most 51 characters that starts with a letter: " +
				"the fleet's Services are named <name>-proxy and <name>-proxy-admin (at most 63)"))
		},
		Entry("52 characters", strings.Repeat("a", 52)),
		Entry("a dot", "team.fleet"),
		Entry("a leading digit", "1fleet"),
	)

	It("stores a TokenProxy name of 51 characters, and models each listed once", func() {
		p := proxy(func(s *twv1alpha1.TokenProxySpec) {
			s.Upstreams = []twv1alpha1.Upstream{
				{Name: "a", URL: "http://a:8000", Models: []string{"gpt-4o"}},
				{Name: "b", URL: "https://b.example/v1", Models: []string{"o3"}},
				{Name: "c", URL: "http://[::1]:8000"},
			}
		})
		p.Name, p.Namespace = strings.Repeat("a", 51), ns
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
	})

	It("stores a TokenProxy on a Redis Cluster and one on a Sentinel primary", func() {
		for i, r := range []twv1alpha1.RedisSpec{
			{URL: "redis+cluster://redis-0.redis:6379,redis-1.redis:6379"},
			{URL: "rediss+sentinel://s-0:26379,s-1:26379/mymaster/0", SentinelPasswordSecretRef: &twv1alpha1.SecretKeyReference{Name: "sentinel"}},
		} {
			p := proxy(func(s *twv1alpha1.TokenProxySpec) {
				s.Storage = twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &r}
			})
			p.Name, p.Namespace = fmt.Sprint("redis-layout-", i), ns
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
		}
	})

	It("refuses an ApiKey without a Secret", func() {
		refused(&twv1alpha1.ApiKey{Spec: twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}}},
			"spec.secretRef.name: Invalid value: \"\": spec.secretRef.name in body should be at least 1 chars long")
	})

	It("stores good objects with their defaults", func() {
		p := proxy(func(*twv1alpha1.TokenProxySpec) {})
		p.Name, p.Namespace = "fleet", ns
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		Expect(*p.Spec.Replicas).To(Equal(int32(1)))
		Expect(p.Spec.Auth.Mode).To(Equal(twv1alpha1.AuthRequired))
		Expect(p.Spec.Storage.Type).To(Equal(twv1alpha1.StorageMemory))
		Expect(p.Spec.Overage).To(Equal(twv1alpha1.OverageDebt), "an undercounted request is never partly free by default")

		b := budget(func(s *twv1alpha1.TokenBudgetSpec) {
			s.Dimension, s.Model = twv1alpha1.DimensionPerModel, "gpt-4o"
		})
		b.Name, b.Namespace = "model", ns
		Expect(k8sClient.Create(ctx, b)).To(Succeed())

		k := &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Name: "alice", Namespace: ns}, Spec: twv1alpha1.ApiKeySpec{
			ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, SecretRef: twv1alpha1.SecretKeyReference{Name: "alice"}}}
		Expect(k8sClient.Create(ctx, k)).To(Succeed())
		Expect(k.Spec.SecretRef.Key).To(Equal("key"))
	})
})
