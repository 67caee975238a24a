// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin_test

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// The test's control plane, the plugin built into binDir, and kubeconfigs.
var (
	testEnv  *envtest.Environment
	cfg      *rest.Config
	k8s      client.Client
	binDir   string
	adminKC  string
	observed = metav1.NewTime(time.Date(2026, 11, 30, 7, 48, 2, 0, time.UTC))
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run `make test-tools` and export KUBEBUILDER_ASSETS=$PWD/bin")
		return 1
	}
	dir, err := os.MkdirTemp("", "plugin-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	binDir = filepath.Join(dir, "bin")
	// The plugin as `make build` builds it, and the proxy whose admin API it reads.
	for _, b := range [][2]string{{"kubectl-tokenwarden", "./cmd/kubectl-tokenwarden"}, {"proxy", "../proxy/cmd/proxy"}} {
		build := exec.Command("go", "build", "-o", filepath.Join(binDir, b[0]), b[1])
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b[0], err, out)
			return 1
		}
	}
	testEnv = &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	if cfg, err = testEnv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = testEnv.Stop() }()
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = twv1alpha1.AddToScheme(s)
	if k8s, err = client.New(cfg, client.Options{Scheme: s}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if adminKC, err = kubeconfig(dir, envtest.User{Name: "admin", Groups: []string{"system:masters"}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// kubeconfig writes a kubeconfig for user, whose current context's namespace is llm.
func kubeconfig(dir string, u envtest.User) (string, error) {
	user, err := testEnv.AddUser(u, cfg)
	if err != nil {
		return "", err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, u.Name+".kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// kubectl runs the real kubectl with the plugin's directory on PATH; it returns
// stdout, stderr and the error of the run.
func kubectl(t *testing.T, kc string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), args...)
	cmd.Env = pluginEnv(t, kc)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// pluginEnv is the environment of a kubectl run: the plugin's directory on PATH (kubectl
// passes no flag before the plugin's name, so the kubeconfig is KUBECONFIG's).
func pluginEnv(t *testing.T, kc string) []string {
	return append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+t.TempDir(), "KUBECONFIG="+kc)
}

// mustKubectl is kubectl that must succeed.
func mustKubectl(t *testing.T, kc string, args ...string) string {
	t.Helper()
	out, errOut, err := kubectl(t, kc, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("output differs from %s; rerun with -update if the change is intended\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// namespace creates a namespace.
func namespace(t *testing.T, name string) {
	t.Helper()
	must(t, k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
}

// budget creates a TokenBudget and writes its status as the operator would.
func budget(t *testing.T, b *twv1alpha1.TokenBudget, st twv1alpha1.TokenBudgetStatus) {
	t.Helper()
	ctx := context.Background()
	must(t, k8s.Create(ctx, b))
	b.Status = st
	must(t, k8s.Status().Update(ctx, b))
}

func i32(n int32) *int32 { return &n }

// fleet is the llm namespace's objects: a Redis fleet of three replicas with a ledger,
// one behind, that cannot read Redis and whose settlements wait in its spool, an
// upstream whose breaker is open on one replica, and three budgets in use.
func fleet(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	namespace(t, ns)
	tp := &twv1alpha1.TokenProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet", Namespace: ns},
		Spec: twv1alpha1.TokenProxySpec{
			Replicas: ptr.To[int32](3),
			Upstreams: []twv1alpha1.Upstream{
				{Name: "vllm", URL: "http://vllm.models.svc:8000"},
				{Name: "claude", URL: "https://api.anthropic.com", Models: []string{"claude-sonnet-4"}},
			},
			Storage: twv1alpha1.StorageSpec{Type: twv1alpha1.StorageRedis, Redis: &twv1alpha1.RedisSpec{URL: "redis://redis:6379/0"}},
			Ledger:  &twv1alpha1.LedgerSpec{},
		},
	}
	must(t, k8s.Create(ctx, tp))
	cond := func(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: observed, ObservedGeneration: 1}
	}
	tp.Status = twv1alpha1.TokenProxyStatus{
		ObservedGeneration: 1, Replicas: 3, ReadyReplicas: 3, Divisor: 1, Storage: twv1alpha1.StorageRedis,
		Budgets: 3, Keys: 2, ConfigGeneration: 7, LiveReplicas: 3, EnforcedReplicas: 2, Enforced: "2/3",
		Upstreams:          "1/2",
		UnhealthyUpstreams: []twv1alpha1.UnhealthyUpstream{{Name: "claude", OpenReplicas: 1, CoolingReplicas: 2}},
		Conditions: []metav1.Condition{
			cond(twv1alpha1.ConditionAccepted, metav1.ConditionTrue, twv1alpha1.ReasonAccepted, "The config renders and validates"),
			cond(twv1alpha1.ConditionReady, metav1.ConditionTrue, twv1alpha1.ReasonDeploymentReady, "3 of 3 proxies ready"),
			cond(twv1alpha1.ConditionEnforced, metav1.ConditionFalse, twv1alpha1.ReasonReplicasBehind,
				"2 of 3 live replicas run config generation 7; fleet-proxy-7d9c5b-c3c3c runs generation 6"),
			cond(twv1alpha1.ConditionDegraded, metav1.ConditionTrue, "NetworkPolicyFailed",
				`NetworkPolicy: networkpolicies.networking.k8s.io "fleet-proxy" is forbidden: exceeded quota`),
			cond(twv1alpha1.ConditionLedgerSpooling, metav1.ConditionTrue, twv1alpha1.ReasonSpooling,
				"Replicas fleet-proxy-7d9c5b-c3c3c cannot write to the ledger database: 12 batches (49152 bytes) wait in their spools, "+
					"the oldest from 2026-11-30T07:40:10Z, and are replayed once it answers. Look at the database and at the proxies' logs (Ledger flush failed)."),
		},
	}
	must(t, k8s.Status().Update(ctx, tp))
	for i, r := range []struct{ name, usage, ledger string }{
		{"fleet-proxy-7d9c5b-a1a1a", `{"w":60,"s":true}`, `{"spool_batches":0,"spool_bytes":0,"flushed_through":"2026-11-30T07:48:00Z"}`},
		{"fleet-proxy-7d9c5b-b2b2b", `{"w":60,"s":true}`, `{"spool_batches":0,"spool_bytes":0,"flushed_through":"2026-11-30T07:47:58Z"}`},
		{"fleet-proxy-7d9c5b-c3c3c", `{"w":60}`,
			`{"spooling":true,"spool_batches":12,"spool_bytes":49152,"oldest":"2026-11-30T07:40:10Z","flushed_through":"2026-11-30T07:40:05Z"}`},
	} {
		must(t, k8s.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: "fleet-proxy-" + r.name, Namespace: ns,
				Labels: map[string]string{twv1alpha1.ReplicaConfigMapLabel: "fleet-proxy"},
				Annotations: map[string]string{twv1alpha1.ReplicaUsageAnnotation: r.usage, twv1alpha1.ReplicaLedgerAnnotation: r.ledger,
					twv1alpha1.ReplicaGenerationAnnotation: fmt.Sprint(7 - i/2)},
			},
			// Renewed now, for an hour: live for the whole test by any clock.
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(r.name), LeaseDurationSeconds: ptr.To[int32](3600), RenewTime: &metav1.MicroTime{Time: time.Now()}},
		}))
	}
	ref := twv1alpha1.ProxyReference{Name: "fleet"}
	budget(t, &twv1alpha1.TokenBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "per-key", Namespace: ns},
		Spec:       twv1alpha1.TokenBudgetSpec{ProxyRef: ref, Dimension: twv1alpha1.DimensionPerAPIKey, TokensPerMinute: 30000, TokensPerDay: 2000000},
	}, twv1alpha1.TokenBudgetStatus{
		Replicas: 1, Storage: twv1alpha1.StorageRedis,
		Summary: twv1alpha1.BudgetSummary{Subjects: "each key", Amount: "tokens", Windows: "30k/min, 2M/day", Action: "Block", PerReplica: "30k/min, 2M/day"},
		Usage: &twv1alpha1.TokenBudgetUsage{
			ObservedAt: observed, Used: "82%",
			Minute:          &twv1alpha1.PeriodUsage{UsedPercent: 82, UsedTokens: 24600},
			Day:             &twv1alpha1.PeriodUsage{UsedPercent: 40, UsedTokens: 800000},
			SubjectsAtLimit: i32(0), TopConsumer: "alice",
			Refusals: twv1alpha1.BudgetRefusals{IntervalSeconds: 60, Minute: 3},
		},
	})
	budget(t, &twv1alpha1.TokenBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "batch-requests", Namespace: ns},
		Spec: twv1alpha1.TokenBudgetSpec{ProxyRef: ref, Dimension: twv1alpha1.DimensionPerAPIKey, Amount: twv1alpha1.AmountRequests,
			Windows: []twv1alpha1.BudgetWindow{{Limit: resource.MustParse("3"), Rolling: &twv1alpha1.RollingWindow{Period: twv1alpha1.PeriodDay}}}},
	}, twv1alpha1.TokenBudgetStatus{
		Replicas: 1, Storage: twv1alpha1.StorageRedis,
		Summary: twv1alpha1.BudgetSummary{Subjects: "each key", Amount: "requests", Windows: "3 req/day", Action: "Block", PerReplica: "3 req/day"},
		Usage: &twv1alpha1.TokenBudgetUsage{
			ObservedAt: observed, Used: "100%", SubjectsAtLimit: i32(1), TopConsumer: "batch",
			Refusals: twv1alpha1.BudgetRefusals{IntervalSeconds: 60},
			Windows:  []twv1alpha1.WindowUsage{{Window: "3 req/day", UsedPercent: i32(100), Used: "3 req", SubjectsAtLimit: i32(1), TopConsumer: "batch", Refused: 2}},
		},
	})
	budget(t, &twv1alpha1.TokenBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "research", Namespace: ns},
		Spec: twv1alpha1.TokenBudgetSpec{ProxyRef: ref, Dimension: twv1alpha1.DimensionPerTeam, Subjects: []string{"research"},
			Windows: []twv1alpha1.BudgetWindow{
				{Limit: resource.MustParse("60k"), Rolling: &twv1alpha1.RollingWindow{Period: twv1alpha1.PeriodMinute, BurstSeconds: 20}},
				{Limit: resource.MustParse("10M"), Rolling: &twv1alpha1.RollingWindow{Period: twv1alpha1.PeriodDay}},
			}},
	}, twv1alpha1.TokenBudgetStatus{
		Replicas: 1, Storage: twv1alpha1.StorageRedis,
		Summary: twv1alpha1.BudgetSummary{Subjects: "research", Amount: "tokens", Windows: "60k/min burst 20s, 10M/day", Action: "Block", PerReplica: "60k/min burst 20s, 10M/day"},
		Usage: &twv1alpha1.TokenBudgetUsage{
			ObservedAt: observed, Used: "60%",
			Refusals: twv1alpha1.BudgetRefusals{IntervalSeconds: 60},
			Windows: []twv1alpha1.WindowUsage{
				{Window: "60k/min burst 20s", UsedPercent: i32(60), Used: "12k"},
				{Window: "10M/day", UsedPercent: i32(5), Used: "500k"},
			},
		},
	})
}

// The real kubectl finds the plugin on PATH; top ranks the subjects and budgets of
// the namespace by their tightest window, and status shows what needs a hand.
func TestTopAndStatus(t *testing.T) {
	fleet(t, "llm")

	rows := table(mustKubectl(t, adminKC, "tokenwarden", "top", "-n", "llm"))
	want := [][]string{
		{"SUBJECT", "KIND", "USED", "WINDOW", "FULL IN", "BUDGET"},
		{"batch", "key", "100%", "3 req/day", "24h", "batch-requests"},
		{"alice", "key", "82%", "30k/min", "49s", "per-key"},
		{"research", "team", "60%", "60k/min burst 20s", "12s", "research"},
	}
	equalTable(t, rows, want)

	golden(t, "top-keys.txt", mustKubectl(t, adminKC, "tokenwarden", "top", "-n", "llm"))
	golden(t, "top-budgets.txt", mustKubectl(t, adminKC, "tokenwarden", "top", "budgets", "-n", "llm"))
	golden(t, "status.txt", mustKubectl(t, adminKC, "tokenwarden", "status", "-n", "llm"))
	golden(t, "top-keys-wide.txt", mustKubectl(t, adminKC, "tokenwarden", "top", "keys", "-n", "llm", "-o", "wide"))
	golden(t, "top-keys.json", mustKubectl(t, adminKC, "tokenwarden", "top", "-n", "llm", "-o", "json"))
	golden(t, "top-budgets-wide.txt", mustKubectl(t, adminKC, "tokenwarden", "top", "budgets", "-n", "llm", "-o", "wide"))
	golden(t, "top-budgets.json", mustKubectl(t, adminKC, "tokenwarden", "top", "budgets", "-n", "llm", "-o", "json"))
	golden(t, "status-wide.txt", mustKubectl(t, adminKC, "tokenwarden", "status", "-n", "llm", "-o", "wide"))
	golden(t, "status.json", mustKubectl(t, adminKC, "tokenwarden", "status", "fleet", "-n", "llm", "-o", "json"))

	// --fleet keeps only that fleet's budgets; -A adds the namespace.
	if out := mustKubectl(t, adminKC, "tokenwarden", "top", "-n", "llm", "--fleet", "other"); !strings.Contains(out, "No budget shows use") {
		t.Errorf("top --fleet other printed %q, want no budget", out)
	}
	all := table(mustKubectl(t, adminKC, "tokenwarden", "top", "budgets", "-A", "--fleet", "llm/fleet"))
	if len(all) != 4 || all[0][0] != "NAMESPACE" || all[1][0] != "llm" || all[1][1] != "batch-requests" {
		t.Errorf("top budgets -A --fleet llm/fleet:\n%v", all)
	}
	// jsonpath is cli-runtime's printer.
	if out := mustKubectl(t, adminKC, "tokenwarden", "top", "-n", "llm", "-o", "jsonpath={.items[0].subject}"); out != "batch" {
		t.Errorf("-o jsonpath printed %q, want batch", out)
	}

	status := mustKubectl(t, adminKC, "tokenwarden", "status", "-n", "llm")
	for _, s := range []string{
		"Enforced=False ReplicasBehind: 2 of 3 live replicas run config generation 7",
		"What to do: Its log says why (`Refused a config document`, with the field); `/admin/effective` on it shows the generation in force.",
		"Degraded=True NetworkPolicyFailed",
		"What to do: Read the message: remove or rename the object in the way, grant the permission, fix the webhook.",
		"Upstream claude unhealthy: circuit breaker open on 1 replica, credential cooling down after a 429 on 2 replicas.",
		"Redis: 1 replica could not read it at the last usage scan (fleet-proxy-7d9c5b-c3c3c)",
		"LedgerSpooling=True Spooling: Replicas fleet-proxy-7d9c5b-c3c3c cannot write to the ledger database",
		"What to do: Make the ledger database reachable from the proxies",
		"Ledger: fleet-proxy-7d9c5b-c3c3c cannot write to the ledger database: 12 batches (48Ki) wait in its spool, " +
			"the oldest from 2026-11-30T07:40:10Z; recorded through 2026-11-30T07:40:05Z.",
	} {
		if !strings.Contains(status, s) {
			t.Errorf("status does not say %q:\n%s", s, status)
		}
	}
	if head := table(status)[1]; strings.Join(head, " ") != "fleet 2/3 7 1/2 2/3 2/3 True" {
		t.Errorf("status row is %q, want the fleet's enforced, generation, upstreams, Redis, ledger and Degraded", head)
	}
	wide := table(mustKubectl(t, adminKC, "tokenwarden", "status", "-n", "llm", "-o", "wide"))
	if got := wide[1][len(wide[1])-1]; got != "2026-11-30T07:40:05Z" {
		t.Errorf("status -o wide's RECORDED THROUGH is %q, want the spooling replica's last flush", got)
	}
}

// A caller with no RBAC gets one line naming what they may not read, and where.
func TestForbidden(t *testing.T) {
	kc, err := kubeconfig(t.TempDir(), envtest.User{Name: "bob"})
	must(t, err)
	for _, args := range [][]string{
		{"tokenwarden", "top", "-n", "llm"},
		{"tokenwarden", "status", "-n", "llm"},
		{"tokenwarden", "status", "fleet", "-n", "llm"},
		{"tokenwarden", "top", "budgets", "-A"},
	} {
		out, errOut, err := kubectl(t, kc, args...)
		if err == nil {
			t.Errorf("kubectl %s succeeded for a user with no RBAC: %s", strings.Join(args, " "), out)
			continue
		}
		resource, where := "tokenbudgets.tokenwarden.io", `in namespace "llm"`
		switch {
		case args[1] == "status" && len(args) == 5:
			resource = `tokenproxies.tokenwarden.io "fleet"`
		case args[1] == "status":
			resource = "tokenproxies.tokenwarden.io"
		case args[len(args)-1] == "-A":
			where = "in any namespace (-A)"
		}
		verb := "list"
		if len(args) == 5 {
			verb = "get"
		}
		wantPrefix := fmt.Sprintf("error: forbidden: you may not %s %s %s; ", verb, resource, where)
		if !strings.HasPrefix(errOut, wantPrefix) || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "goroutine") {
			t.Errorf("kubectl %s printed %q, want one line starting %q", strings.Join(args, " "), errOut, wantPrefix)
		}
		if args[1] == "top" && args[2] == "-n" {
			golden(t, "forbidden.txt", errOut)
		}
		if !strings.Contains(errOut, `User "bob" cannot`) {
			t.Errorf("kubectl %s: %q does not say who was refused", strings.Join(args, " "), errOut)
		}
	}
}

// A tenant who may read the budgets and fleets of their namespace, but not the
// replicas' Leases, sees their ranking and the fleet's status, with Redis and the
// ledger's reports unknown and the LedgerSpooling condition still told.
func TestTenant(t *testing.T) {
	ctx := context.Background()
	fleet(t, "team-a")
	must(t, k8s.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "tokenwarden-reader", Namespace: "team-a"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"tokenwarden.io"}, Resources: []string{"tokenbudgets", "tokenproxies"}, Verbs: []string{"get", "list", "watch"}}},
	}))
	must(t, k8s.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "carol", Namespace: "team-a"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tokenwarden-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "carol"}},
	}))
	kc, err := kubeconfig(t.TempDir(), envtest.User{Name: "carol"})
	must(t, err)
	rows := table(mustKubectl(t, kc, "tokenwarden", "top", "-n", "team-a"))
	if len(rows) != 4 || rows[1][0] != "batch" {
		t.Errorf("the tenant's top:\n%v", rows)
	}
	status := mustKubectl(t, kc, "tokenwarden", "status", "-n", "team-a")
	if head := table(status)[1]; strings.Join(head, " ") != "fleet 2/3 7 1/2 unknown unknown True" {
		t.Errorf("the tenant's status row is %q, want Redis and the ledger unknown", head)
	}
	for _, want := range []string{
		`Redis: the replicas' reports are not readable: forbidden: you may not list leases.coordination.k8s.io in namespace "team-a"`,
		`Ledger: the replicas' reports are not readable: forbidden: you may not list leases.coordination.k8s.io in namespace "team-a"`,
		"LedgerSpooling=True Spooling",
	} {
		if !strings.Contains(status, want) {
			t.Errorf("the tenant's status does not say %q:\n%s", want, status)
		}
	}
	if _, errOut, err := kubectl(t, kc, "tokenwarden", "top", "-n", "llm"); err == nil || !strings.Contains(errOut, `forbidden: you may not list tokenbudgets.tokenwarden.io in namespace "llm"`) {
		t.Errorf("the tenant's top of another namespace: %v %q", err, errOut)
	}
}

// top --watch prints the ranking again when a budget's use changes.
func TestTopWatch(t *testing.T) {
	ctx := context.Background()
	fleet(t, "watched")
	cmd := exec.Command(filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), "tokenwarden", "top", "-n", "watched", "--watch")
	cmd.Env = pluginEnv(t, adminKC)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	waitFor := func(prefix string) {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("top --watch ended before printing %q", prefix)
				}
				if strings.Join(strings.Fields(l), " ") == prefix {
					return
				}
			case <-deadline:
				t.Fatalf("top --watch did not print %q", prefix)
			}
		}
	}
	waitFor("alice key 82% 30k/min 49s per-key")
	var b twv1alpha1.TokenBudget
	must(t, k8s.Get(ctx, client.ObjectKey{Namespace: "watched", Name: "per-key"}, &b))
	b.Status.Usage.Minute = &twv1alpha1.PeriodUsage{UsedPercent: 100, UsedTokens: 30000}
	b.Status.Usage.Used = "100%"
	must(t, k8s.Status().Update(ctx, &b))
	waitFor("alice key 100% 30k/min 60s per-key")
}

// table splits a table into its rows' cells (a column of two words, such as FULL IN,
// is split too: rows compare as printed, cell by cell).
func table(out string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			break
		}
		rows = append(rows, splitColumns(l))
	}
	return rows
}

// splitColumns splits a table line at runs of two or more spaces (the tab writer's
// padding is at least three), so that "FULL IN" and "60k/min burst 20s" stay one cell.
func splitColumns(l string) []string {
	var cells []string
	for _, c := range strings.Split(l, "   ") {
		if c = strings.TrimSpace(c); c != "" {
			cells = append(cells, c)
		}
	}
	return cells
}

func equalTable(t *testing.T, got, want [][]string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("table:\n%v\nwant\n%v", got, want)
	}
}
