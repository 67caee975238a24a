// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

type clock struct{ t time.Time }

func (c *clock) Now() time.Time { return c.t }

func tokens(kind budget.Kind, dim budget.Dimension, id string, capacity float64) budget.Charge {
	return budget.Charge{Key: budget.Key{Kind: kind, Dim: dim, ID: id}, Capacity: capacity, Rate: capacity / kind.Period().Seconds(),
		SharedCapacity: capacity, SharedRate: capacity / kind.Period().Seconds()}
}

func reserve(t *testing.T, s budget.Store, amount int64, cs ...budget.Charge) {
	t.Helper()
	res, err := s.Reserve(context.Background(), &budget.Reservation{Tokens: budget.WithAmount(cs, float64(amount))})
	if err != nil || !res.Admitted {
		t.Fatalf("reserve %d on %v: %+v, %v", amount, cs, res, err)
	}
}

func summary(t *testing.T, s *Summarizer) *Usage {
	t.Helper()
	u, err := s.Summary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// What the operator reads is the annotation: read the report back from it.
	var back Usage
	if err := json.Unmarshal([]byte(u.Encode()), &back); err != nil {
		t.Fatal(err)
	}
	return &back
}

// find returns a report's budget of a dimension (and model).
func find(u *Usage, dim, model string) *BudgetUsage {
	for i := range u.Budgets {
		if u.Budgets[i].Dimension == dim && u.Budgets[i].Model == model {
			return &u.Budgets[i]
		}
	}
	return nil
}

// TestSummaryMemory drains buckets of a replica's memory and reads its report: the one
// bucket of the global and model dimensions with its use, and of the per-key dimension
// the subjects at their limit and the most used ones; the refusals since the last
// report; an idle replica's report, which does not change from one scan to the next.
func TestSummaryMemory(t *testing.T) {
	c := &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	mem := budget.NewMemory(c, 1000)
	refusals := &Refusals{}
	s := &Summarizer{Levels: mem, Refusals: refusals, Every: 15 * time.Second}

	idle := summary(t, s)
	if idle.Encode() != `{"w":60}` || summary(t, s).Encode() != idle.Encode() {
		t.Fatalf("an idle replica's report: %s", idle.Encode())
	}

	global := tokens(budget.TokensMinute, budget.Global, "", 10000)
	reserve(t, mem, 980, tokens(budget.TokensMinute, budget.APIKey, "alice", 1000), global, tokens(budget.TokensMinute, budget.Model, "claude", 4000))
	reserve(t, mem, 960, tokens(budget.TokensMinute, budget.APIKey, "bob", 1000), global)
	reserve(t, mem, 100, tokens(budget.TokensMinute, budget.APIKey, "carol", 1000), tokens(budget.TokensDay, budget.APIKey, "carol", 100000), global)
	reserve(t, mem, 10, tokens(budget.TokensMinute, budget.APIKey, "dave", 1000), global)
	reserve(t, mem, 10, tokens(budget.TokensMinute, budget.APIKey, "erin", 1000), global)
	refusals.Refused(budget.APIKey, budget.TokensMinute, "claude")
	refusals.Refused(budget.APIKey, budget.TokensMinute, "claude")
	refusals.Refused(budget.Model, budget.TokensDay, "claude")
	refusals.Refused(budget.Team, budget.Requests, "claude")

	u := summary(t, s)
	if u.Window != 60 || u.Shared || u.Cut != 0 {
		t.Fatalf("report %s", u.Encode())
	}
	g := find(u, "global", "")
	if g == nil || *g.Minute != (Level{Used: 2060, Capacity: 10000}) || g.Day != nil || g.InUse != 0 {
		t.Fatalf("global: %+v", g)
	}
	m := find(u, "model", "claude")
	if m == nil || *m.Minute != (Level{Used: 980, Capacity: 4000}) || *m.Refused != (Refused{Day: 1}) {
		t.Fatalf("model claude: %+v", m)
	}
	k := find(u, "api_key", "")
	if k == nil || k.AtLimit != 2 || k.InUse != 6 || *k.Refused != (Refused{Minute: 2}) {
		t.Fatalf("api_key: %+v", k)
	}
	want := []Top{
		{ID: "alice", Period: "minute", Level: Level{Used: 980, Capacity: 1000}},
		{ID: "bob", Period: "minute", Level: Level{Used: 960, Capacity: 1000}},
		{ID: "carol", Period: "minute", Level: Level{Used: 100, Capacity: 1000}},
		{ID: "carol", Period: "day", Level: Level{Used: 100, Capacity: 100000}},
	}
	if fmt.Sprint(k.Top) != fmt.Sprint(want) {
		t.Fatalf("top subjects: %+v, want %+v", k.Top, want)
	}
	if tm := find(u, "team", ""); tm == nil || *tm.Refused != (Refused{Requests: 1}) || tm.InUse != 0 {
		t.Fatalf("team: %+v", tm)
	}

	// The buckets refill: a minute later only the day bucket carol draws on is in use;
	// the refusals count for RefusalScans scans, and then no more.
	c.t = c.t.Add(time.Minute)
	u = summary(t, s)
	if k := find(u, "api_key", ""); k == nil || k.InUse != 1 || *k.Refused != (Refused{Minute: 2}) || find(u, "team", "") == nil {
		t.Fatalf("a minute later: %s", u.Encode())
	}
	for range RefusalScans - 1 {
		u = summary(t, s)
	}
	if len(u.Budgets) != 1 || u.Budgets[0].Dimension != "api_key" || u.Budgets[0].InUse != 1 || u.Budgets[0].AtLimit != 0 || u.Budgets[0].Refused != nil {
		t.Fatalf("%d scans later: %s", RefusalScans, u.Encode())
	}
}

// TestSummaryTies: subjects equally far into their allowance are named in name
// order, so the same buckets always make the same report.
func TestSummaryTies(t *testing.T) {
	c := &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	mem := budget.NewMemory(c, 1000)
	for _, id := range []string{"erin", "carol", "alice", "dave", "bob"} {
		reserve(t, mem, 1000, tokens(budget.TokensDay, budget.Team, id, 1000))
	}
	s := &Summarizer{Levels: mem, Every: 15 * time.Second}
	first := summary(t, s).Encode()
	for range 20 {
		if again := summary(t, s).Encode(); again != first {
			t.Fatalf("the same buckets made two reports:\n%s\n%s", first, again)
		}
	}
	tm := find(summary(t, s), "team", "")
	if tm.AtLimit != 5 || len(tm.Top) != 3 || tm.Top[0].ID != "alice" || tm.Top[1].ID != "bob" || tm.Top[2].ID != "carol" {
		t.Fatalf("team: %+v", tm)
	}
}

// TestSummaryBounded fills thousands of model budgets: the report stays within
// MaxUsageBytes, keeps the most used, and says how many it left out.
func TestSummaryBounded(t *testing.T) {
	c := &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	mem := budget.NewMemory(c, 100000)
	const models = 4000
	for i := range models {
		reserve(t, mem, int64(1+i%1000), tokens(budget.TokensMinute, budget.Model, fmt.Sprintf("model-%04d", i), 1000),
			tokens(budget.TokensDay, budget.Model, fmt.Sprintf("model-%04d", i), 100000))
	}
	reserve(t, mem, 999, tokens(budget.TokensMinute, budget.APIKey, "alice", 1000))
	u, err := (&Summarizer{Levels: mem, Every: 15 * time.Second}).Summary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	enc := u.Encode()
	if len(enc) > MaxUsageBytes || u.Cut == 0 || u.Cut+len(u.Budgets) != models+1 {
		t.Fatalf("%d bytes, %d budgets, %d cut", len(enc), len(u.Budgets), u.Cut)
	}
	if u.Budgets[0].Dimension != "api_key" || u.Budgets[0].AtLimit != 1 {
		t.Fatalf("the per-key dimension comes first: %+v", u.Budgets[0])
	}
	least := u.Budgets[len(u.Budgets)-1]
	if least.Minute.Used < 1000-int64(len(u.Budgets)/4)-1 {
		t.Fatalf("kept a model using %d of 1000 among %d: the most used come first", least.Minute.Used, len(u.Budgets))
	}
	t.Logf("%d model budgets in use: the report holds %d in %d bytes and leaves out %d", models, len(u.Budgets), len(enc), u.Cut)
}

// TestSummaryRedis reads the fleet's shared buckets, whichever replica drew on them;
// when Redis cannot be read it reports the replica's own buckets, marked as its share.
func TestSummaryRedis(t *testing.T) {
	srv := redisserver.Start(t)
	shared, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: "llm/fleet", DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shared.Close() })
	other, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: "llm/fleet"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	reserve(t, other, 990, tokens(budget.TokensMinute, budget.User, "ann", 1000), tokens(budget.TokensDay, budget.Global, "", 1e6))
	mem := budget.NewMemory(budget.SystemClock{}, 100)
	reserve(t, mem, 10, tokens(budget.TokensMinute, budget.User, "ann", 500))
	s := &Summarizer{Levels: shared, Shared: true, Fallback: mem, Every: 15 * time.Second}

	u := summary(t, s)
	if !u.Shared {
		t.Fatalf("not shared: %s", u.Encode())
	}
	usr, g := find(u, "user", ""), find(u, "global", "")
	if usr == nil || usr.AtLimit != 1 || usr.Top[0].ID != "ann" || usr.Top[0].Capacity != 1000 || usr.Top[0].Used < 989 {
		t.Fatalf("user: %s", u.Encode())
	}
	if g == nil || g.Day.Capacity != 1e6 || g.Day.Used < 989 || g.Day.Used > 990 {
		t.Fatalf("global: %s", u.Encode())
	}

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	u = summary(t, s)
	if usr := find(u, "user", ""); u.Shared || usr == nil || usr.Top[0].Capacity != 500 || usr.AtLimit != 0 {
		t.Fatalf("with Redis down: %s", u.Encode())
	}
}

// TestLeaseUsage: the Lease carries the latest report, and is written for it only
// when it changed.
func TestLeaseUsage(t *testing.T) {
	cs := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fleet-proxy", Namespace: "llm", UID: "cm-uid"}})
	var mu sync.Mutex
	report := `{"w":1}`
	var carried []string
	cs.PrependReactor("patch", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), UsageAnnotation) {
			carried = append(carried, report)
		}
		return false, nil, nil
	})
	l := &Lease{Client: cs, Namespace: "llm", ConfigMap: "fleet-proxy", Replica: "r0", Renew: 20 * time.Millisecond,
		UsageEvery: 20 * time.Millisecond, Usage: func(context.Context) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return report, nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	l.Applied(1, "d1")

	annotation := func() string {
		le, err := cs.CoordinationV1().Leases("llm").Get(context.Background(), "fleet-proxy-r0", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return le.Annotations[UsageAnnotation]
	}
	renewals := func() int {
		n := 0
		for _, a := range cs.Actions() {
			if a.GetVerb() == "patch" || a.GetVerb() == "create" {
				n++
			}
		}
		return n
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: annotation %q", what, annotation())
			}
		}
	}
	waitFor("the first report", func() bool { return annotation() == `{"w":1}` })
	n := renewals()
	waitFor("five renewals", func() bool { return renewals() >= n+5 })
	mu.Lock()
	if len(carried) != 0 {
		t.Fatalf("renewals carried the unchanged report %v", carried)
	}
	report = `{"w":1,"b":[{"dim":"global","m":{"u":5,"c":10}}]}`
	mu.Unlock()
	waitFor("the changed report", func() bool { return annotation() == report })
	n = renewals()
	waitFor("five more renewals", func() bool { return renewals() >= n+5 })
	mu.Lock()
	defer mu.Unlock()
	if len(carried) != 1 {
		t.Fatalf("the changed report was written %d times, want once", len(carried))
	}
}
