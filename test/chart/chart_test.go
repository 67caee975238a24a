// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package chart tests the Helm chart: lint, rendered output against golden files, the
// alert rules under promtool with synthetic series, the metric names the rules and
// the dashboard use against a running proxy's /metrics, and an install against a real
// API server.
package chart

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const chartDir = "../../charts/tokenwarden"

func tool(t *testing.T, name string) string {
	t.Helper()
	if name == "promtool" {
		p, err := exec.LookPath("promtool")
		if err != nil {
			t.Fatalf("promtool is not on PATH: install Debian's prometheus package (.ci/run does)")
		}
		return p
	}
	p := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run the tests through `make test`, which builds it into bin/", name)
	}
	return p
}

func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String()
}

func TestLint(t *testing.T) {
	helm := tool(t, "helm")
	run(t, helm, "lint", "--strict", chartDir)
	run(t, helm, "lint", "--strict", chartDir, "--set", "serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true")
}

func TestTemplateGolden(t *testing.T) {
	helm := tool(t, "helm")
	for name, set := range map[string]string{
		"default":     "",
		"all-enabled": "serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true,crds.keep=false,image.tag=v1",
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"template", "tw", chartDir, "--namespace", "tokenwarden-system"}
			if set != "" {
				args = append(args, "--set", set)
			}
			got := run(t, helm, args...)
			golden := filepath.Join("testdata", name+".yaml")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("helm template %s differs from %s; rerun with -update if the change is intended", name, golden)
			}
		})
	}
}

func TestSchemaRefusesBadValues(t *testing.T) {
	for _, c := range []struct{ set, field string }{
		{"serviceMonitor.interval=soon", "/serviceMonitor/interval"},
		{"metrics.secure=maybe", "/metrics/secure"},
		{"metrics.readers[0].name=prometheus", "/metrics/readers/0"}, // no namespace
	} {
		cmd := exec.Command(tool(t, "helm"), "template", "tw", chartDir, "--set", c.set)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.field) {
			t.Errorf("--set %s was accepted or %s not named: %v\n%s", c.set, c.field, err, out)
		}
	}
}

// TestOperatorPod: the operator pod's labels (under the selector's), pull Secrets,
// affinity and topology spread come from the values.
func TestOperatorPod(t *testing.T) {
	got := run(t, tool(t, "helm"), "template", "tw", chartDir, "--show-only", "templates/deployment.yaml",
		"--set", `podLabels.team=ml,podLabels.app\.kubernetes\.io/component=hijack,imagePullSecrets[0].name=registry`,
		"--set", "topologySpreadConstraints[0].maxSkew=1,topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
		"--set", "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
		"--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
		"--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists")
	for _, want := range []string{
		"        team: ml\n", "      imagePullSecrets:\n        - name: registry", "      topologySpreadConstraints:\n        - maxSkew: 1",
		"      affinity:\n        nodeAffinity:",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the operator Deployment lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "hijack") {
		t.Errorf("podLabels overrode a selector label:\n%s", got)
	}
}

// TestReportLeasePolicy: the chart installs the same report Lease admission policy as
// config/admission (whose behaviour the controller specs test against the API server),
// and none with reportLeasePolicy.enabled=false.
func TestReportLeasePolicy(t *testing.T) {
	helm := tool(t, "helm")
	got := run(t, helm, "template", "tw", chartDir, "--show-only", "templates/report-lease-policy.yaml")
	docs := strings.Split(got, "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("want the policy and its binding, got %d documents:\n%s", len(docs), got)
	}
	var policy, wantPolicy admissionregistrationv1.ValidatingAdmissionPolicy
	var binding, wantBinding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, d := range []struct {
		chart, file string
		into, want  any
	}{
		{docs[0], "report_lease_policy.yaml", &policy, &wantPolicy},
		{docs[1], "report_lease_policy_binding.yaml", &binding, &wantBinding},
	} {
		if err := yaml.UnmarshalStrict([]byte(d.chart), d.into); err != nil {
			t.Fatalf("the chart's %s: %v", d.file, err)
		}
		data, err := os.ReadFile(filepath.Join("..", "..", "config", "admission", d.file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(data, d.want); err != nil {
			t.Fatalf("config/admission/%s: %v", d.file, err)
		}
	}
	if binding.Spec.PolicyName != policy.Name {
		t.Errorf("the binding names policy %q, the chart's is %q", binding.Spec.PolicyName, policy.Name)
	}
	binding.Spec.PolicyName = wantBinding.Spec.PolicyName
	if !equality.Semantic.DeepEqual(policy.Spec, wantPolicy.Spec) {
		t.Errorf("the chart's policy differs from config/admission's:\nchart:  %+v\nconfig: %+v", policy.Spec, wantPolicy.Spec)
	}
	if !equality.Semantic.DeepEqual(binding.Spec, wantBinding.Spec) {
		t.Errorf("the chart's binding differs from config/admission's:\nchart:  %+v\nconfig: %+v", binding.Spec, wantBinding.Spec)
	}
	if off := run(t, helm, "template", "tw", chartDir, "--set", "reportLeasePolicy.enabled=false"); strings.Contains(off, "ValidatingAdmissionPolicy") {
		t.Errorf("reportLeasePolicy.enabled=false still renders the policy")
	}
}

// TestMetricsEndpointSecured: the operator serves its metrics over HTTPS to callers
// the API server authorizes, and the ServiceMonitor scrapes it so; metrics.secure=false
// goes back to plain HTTP.
func TestMetricsEndpointSecured(t *testing.T) {
	helm := tool(t, "helm")
	secure := run(t, helm, "template", "tw", chartDir, "--set", "serviceMonitor.enabled=true",
		"--set", "metrics.readers[0].name=prometheus,metrics.readers[0].namespace=monitoring")
	for _, want := range []string{
		"--metrics-bind-address=:8443", "--metrics-secure=true", "containerPort: 8443", "port: 8443",
		"scheme: https", "bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
		"name: tw-tokenwarden-metrics-reader", `nonResourceURLs: ["/metrics"]`,
		"  name: prometheus\n  namespace: monitoring",
		"resources:\n  - tokenreviews\n  verbs:\n  - create", "resources:\n  - subjectaccessreviews\n  verbs:\n  - create",
	} {
		if !strings.Contains(secure, want) {
			t.Errorf("the secure chart lacks %q", want)
		}
	}
	plain := run(t, helm, "template", "tw", chartDir, "--set", "serviceMonitor.enabled=true,metrics.secure=false")
	for _, want := range []string{"--metrics-bind-address=:8080", "--metrics-secure=false", "port: 8080"} {
		if !strings.Contains(plain, want) {
			t.Errorf("metrics.secure=false lacks %q", want)
		}
	}
	for _, unwanted := range []string{"scheme: https", "metrics-reader"} {
		if strings.Contains(plain, unwanted) {
			t.Errorf("metrics.secure=false still renders %q", unwanted)
		}
	}
}

func TestAlertRules(t *testing.T) {
	promtool := tool(t, "promtool")
	dir := t.TempDir()
	rules, err := os.ReadFile(filepath.Join(chartDir, "rules", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rendered := strings.ReplaceAll(string(rules), "SATURATED_FOR", "15m")
	if err := os.WriteFile(filepath.Join(dir, "alerts.rendered.yaml"), []byte(rendered), 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(chartDir, "rules", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, promtool, "check", "rules", filepath.Join(dir, "alerts.rendered.yaml"))
	run(t, promtool, "test", "rules", filepath.Join(dir, "alerts_test.yaml"))
}

var metricName = regexp.MustCompile(`\b(?:rate_limit|tokenwarden)_[a-z_]+\b`)

// TestMetricNamesExist scrapes a running proxy and checks that every metric the
// alerts and the dashboard use is one it exports.
func TestMetricNamesExist(t *testing.T) {
	var used []string
	for _, f := range []string{filepath.Join(chartDir, "rules", "alerts.yaml"), filepath.Join(chartDir, "dashboards", "tokenwarden.json")} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		used = append(used, metricName.FindAllString(string(data), -1)...)
	}

	// A proxy whose Redis is unreachable (so the fallback counter has a series), with a
	// key whose budget one request exhausts; and one on a running Redis with a priced
	// model and a monthly dollar budget (so the spend and the rule windows' series
	// show); and one with a model registry whose requests fail over, overflow a context
	// window, fall back and find every upstream out (providers_test.go); and one whose
	// durable counters are fenced, with its store checks on (durable_test.go).
	exported := exportedBy(t, "redis://127.0.0.1:1/0", `
  limits:
    per_api_key: {tokens_per_minute: 200}
`, "", "tokenwarden_api_key_usage_tokens_total")
	rs := redisserver.Start(t)
	for name := range exportedBy(t, rs.URL(), `
  rules:
  - {name: alice-dollars, dimension: api_key, amount: cost, windows: [{limit: 25, calendar: {every: month}}]}
`, "models: [{name: m, price: {input: 2.5, output: 10}, upstreams: [{upstream: fake}]}]", "tokenwarden_spend_dollars_total") {
		exported[name] = true
	}
	for name := range providersExported(t) {
		exported[name] = true
	}
	for name := range ledgerExported(t) {
		exported[name] = true
	}
	for name := range cacheExported(t) {
		exported[name] = true
	}
	for name := range durableExported(t) {
		exported[name] = true
	}
	var missing []string
	for _, u := range used {
		if !exported[u] {
			missing = append(missing, u)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("the rules or the dashboard use metrics a proxy does not export: %v", missing)
	}
	if len(used) < 10 {
		t.Fatalf("found only %d metric references; the pattern is broken", len(used))
	}
}

// exportedBy runs a proxy on the Redis at redisURL with the rate_limiting settings
// given, sends it three requests as alice, and returns the metric families its /metrics
// lists once the family until shows.
func exportedBy(t *testing.T, redisURL, rateLimiting, models, until string) map[string]bool {
	t.Helper()
	backend := httptest.NewServer(fakellm.New())
	defer backend.Close()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	mem := budget.NewMemory(budget.SystemClock{}, 100)
	store, err := redisstore.New(redisstore.Options{URL: redisURL, DialTimeout: 50 * time.Millisecond,
		ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond, Fallback: mem, Recorder: m})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = store.Close() }()
	srv := server.New(server.Options{Store: store, Memory: mem, Metrics: m, AsyncSettle: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	doc := `
upstreams: [{name: fake, url: "` + backend.URL + `", capacity: {max_in_flight_requests: 64}}]
` + models + `
api_keys: [{name: alice, key_sha256: "` + sha256Hex("sk-alice") + `", user: alice, team: search}]
rate_limiting:
  storage: redis
  redis: {url: "` + redisURL + `"}
  budget_division: {replicas: 1}
` + rateLimiting
	if _, err := srv.Apply([]byte(doc), "test"); err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(srv)
	defer front.Close()
	// The third asks for more than a minute budget of 200 holds: refused by class.
	for i, ceiling := range []string{"100", "100", "100000"} {
		req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":`+ceiling+`}`))
		req.Header.Set("Authorization", "Bearer sk-alice")
		req.Header.Set("X-Stainless-Retry-Count", strconv.Itoa(i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	admin := httptest.NewServer(srv.AdminHandler(reg))
	defer admin.Close()
	var scraped string
	deadline := time.Now().Add(30 * time.Second) // generous: the loop ends as soon as the series shows
	for {
		resp, err := http.Get(admin.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		scraped = string(b)
		if strings.Contains(scraped, until) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return families(scraped)
}

// TestInstall installs the chart into a real API server and checks the operator's
// objects exist.
// apiServer starts a kube-apiserver without CRDs for one test and returns its config
// and the path of an administrator's kubeconfig.
func apiServer(t *testing.T) (*rest.Config, string) {
	t.Helper()
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg, kubeconfig
}

func TestInstall(t *testing.T) {
	helm := tool(t, "helm")
	cfg, kubeconfig := apiServer(t)
	run(t, helm, "install", "tw", chartDir, "--kubeconfig", kubeconfig, "--namespace", "tokenwarden-system", "--create-namespace")

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var d appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: "tokenwarden-system", Name: "tw-tokenwarden"}, &d); err != nil {
		t.Fatalf("the operator Deployment: %v", err)
	}
	if args := strings.Join(d.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--proxy-image=tokenwarden:0.1.0") {
		t.Errorf("operator args %q", args)
	}
	for _, name := range []string{"tokenproxies.tokenwarden.io", "tokenbudgets.tokenwarden.io", "apikeys.tokenwarden.io"} {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
			t.Errorf("CRD %s: %v", name, err)
		} else if crd.Annotations["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD %s is not kept on uninstall", name)
		}
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "tw-tokenwarden-proxy-report-lease"}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}); err != nil {
		t.Errorf("the report Lease policy's binding: %v", err)
	}
}

// TestReportLeasePolicyWithoutCRDs: the chart installed with crds.enabled=false before
// the CRDs are (the policy's parameter kind, TokenProxy, is not served) refuses no
// Lease: there is no fleet to hold to it, and leader elections go on.
func TestReportLeasePolicyWithoutCRDs(t *testing.T) {
	cfg, kubeconfig := apiServer(t)
	run(t, tool(t, "helm"), "install", "tw", chartDir, "--kubeconfig", kubeconfig, "--namespace", "tokenwarden-system",
		"--create-namespace", "--set", "crds.enabled=false")
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lease := func(name string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	}
	// A policy created after the chart's refuses the Lease "sentinel": once it does, the
	// API server enforces the chart's policy too.
	sentinel := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "sentinel"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"coordination.k8s.io"}, APIVersions: []string{"*"}, Resources: []string{"leases"}}}}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "object.metadata.name != 'sentinel'"}}}}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "sentinel"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "sentinel",
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
	for _, o := range []client.Object{sentinel, binding} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for err := admin.Create(ctx, lease("sentinel")); err == nil || !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err); err = admin.Create(ctx, lease("sentinel")) {
		if err == nil {
			_ = admin.Delete(ctx, lease("sentinel"))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sentinel policy never took effect: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if err := admin.Create(ctx, lease("leader")); err != nil {
		t.Errorf("an administrator's Lease: %v", err)
	}
	// An account the chart's policy would check against the TokenProxies, were they served.
	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:default:app-proxy", Groups: []string{"system:masters"},
		Extra: map[string][]string{"authentication.kubernetes.io/pod-name": {"app-proxy-0"}}}
	sa, err := client.New(as, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := sa.Create(ctx, lease("app-proxy-leader")); err != nil {
		t.Errorf("a ServiceAccount's Lease: %v", err)
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
