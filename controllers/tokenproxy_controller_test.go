// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata/")

func newNamespace(prefix string) string {
	GinkgoHelper()
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	Expect(k8sClient.Create(ctx, n)).To(Succeed())
	return n.Name
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func fleetProxy(ns string, replicas int32) *twv1alpha1.TokenProxy {
	return &twv1alpha1.TokenProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet", Namespace: ns},
		Spec: twv1alpha1.TokenProxySpec{
			Replicas: ptr.To(replicas),
			Upstreams: []twv1alpha1.Upstream{
				{Name: "claude", URL: "https://anthropic.internal:443", Models: []string{"claude-sonnet"},
					CredentialSecretRef: &twv1alpha1.SecretKeyReference{Name: "provider", Key: "anthropic"}},
				{Name: "vllm", URL: "http://vllm.models.svc:8000/v1base"},
			},
			Auth: twv1alpha1.AuthSpec{TrustedProxies: []string{"10.0.0.0/8"}},
		},
	}
}

func tokenBudget(ns, name string, dim twv1alpha1.Dimension, model string, tpm, tpd int64) *twv1alpha1.TokenBudget {
	return &twv1alpha1.TokenBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}, Dimension: dim, Model: model,
			TokensPerMinute: tpm, TokensPerDay: tpd},
	}
}

func apiKey(ns, name, secret, user, team string) *twv1alpha1.ApiKey {
	return &twv1alpha1.ApiKey{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"},
			SecretRef: twv1alpha1.SecretKeyReference{Name: secret}, User: user, Team: team},
	}
}

// keySecret is a Secret labelled for ApiKeys.
func keySecret(ns, name, key string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Labels: map[string]string{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageAPIKey}}, StringData: map[string]string{"key": key}}
}

// credentialSecret is a Secret labelled for the proxy pods.
func credentialSecret(ns, name string, data map[string]string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Labels: map[string]string{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageCredential}}, StringData: data}
}

// rendered reads and parses the fleet's proxy config, as the proxy would.
func rendered(g Gomega, ns string) *config.Config {
	c, err := config.Parse(document(g, ns))
	g.Expect(err).NotTo(HaveOccurred(), "the rendered document must load in the proxy")
	return c
}

// document reads the fleet's config document as the proxy does: whole from the
// ConfigMap, or from the chunks its manifest names.
func document(g Gomega, ns string) []byte { return fleetDocument(g, ns, "fleet") }

// fleetDocument is document for the fleet of that name.
func fleetDocument(g Gomega, ns, fleet string) []byte {
	var cm corev1.ConfigMap
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: fleet + "-proxy"}, &cm)).To(Succeed())
	if doc, ok := cm.Data["proxy.yaml"]; ok {
		return []byte(doc)
	}
	m, err := config.ParseManifest([]byte(cm.Data[config.ManifestKey]))
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := m.Assemble(func(name string) ([]byte, bool) {
		var chunk corev1.ConfigMap
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &chunk); err != nil {
			return nil, false
		}
		d, ok := chunk.Data[config.ChunkKey]
		return []byte(d), ok
	})
	g.Expect(err).NotTo(HaveOccurred())
	return doc
}

func budgetStatus(g Gomega, ns, name string) twv1alpha1.TokenBudgetStatus {
	var b twv1alpha1.TokenBudget
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &b)).To(Succeed())
	return b.Status
}

func condition(conds []metav1.Condition, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// verdict is a condition as the tests compare it, without its times.
type verdict struct {
	Status  metav1.ConditionStatus
	Reason  string
	Message string
}

func verdictOf(conds []metav1.Condition, typ string) verdict {
	c := condition(conds, typ)
	return verdict{c.Status, c.Reason, c.Message}
}

// warningReasons are the reasons of the warning events recorded in a namespace.
func warningReasons(g Gomega, ns string) []string {
	var evs corev1.EventList
	g.Expect(k8sClient.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
	var reasons []string
	for _, e := range evs.Items {
		if e.Type == corev1.EventTypeWarning {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}

var _ = Describe("The fleet reconciler", func() {
	It("renders the fleet's overage rule, IPv6 client prefix and retry patience", func() {
		ns := newNamespace("overage")
		tp := fleetProxy(ns, 1)
		tp.Spec.Overage, tp.Spec.ClientIPv6PrefixLength, tp.Spec.RetryPatienceSeconds = twv1alpha1.OverageForgive, 48, 20
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			c := rendered(g, ns)
			g.Expect(c.RateLimiting.Overage).To(Equal(config.OverageForgive))
			g.Expect(c.RateLimiting.ClientIPv6Prefix).To(Equal(48))
			g.Expect(c.RetryPatience()).To(Equal(20 * time.Second))
		}).Should(Succeed())
	})

	It("renders budgets and keys into the ConfigMap the proxies load, with key hashes only", func() {
		ns := newNamespace("render")
		for _, o := range []client.Object{
			keySecret(ns, "alice", "sk-alice"), keySecret(ns, "bob", "sk-bob"),
			credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}),
			tokenBudget(ns, "global", twv1alpha1.DimensionGlobal, "", 600000, 0),
			tokenBudget(ns, "per-key", twv1alpha1.DimensionPerAPIKey, "", 60000, 5000000),
			tokenBudget(ns, "sonnet", twv1alpha1.DimensionPerModel, "claude-sonnet", 100000, 0),
			apiKey(ns, "alice", "alice", "alice", "research"),
			func() client.Object {
				k := apiKey(ns, "bob", "bob", "bob", "research")
				k.Spec.TokensPerMinute = 90000
				return k
			}(),
			fleetProxy(ns, 3),
		} {
			Expect(k8sClient.Create(ctx, o)).To(Succeed())
		}

		var doc []byte
		Eventually(func(g Gomega) {
			c := rendered(g, ns)
			g.Expect(c.APIKeys).To(HaveLen(2))
			g.Expect(c.RateLimiting.Limits.PerModel).To(HaveKey("claude-sonnet"))
			g.Expect(c.APIKeys[0].KeySHA256).To(Equal(sha("sk-alice")))
			c.Generation = 0
			var err error
			doc, err = c.Marshal()
			g.Expect(err).NotTo(HaveOccurred())
		}).Should(Succeed())
		Expect(string(doc)).NotTo(ContainSubstring("sk-alice"), "the key itself never reaches the ConfigMap")

		golden := filepath.Join("testdata", "rendered-fleet.yaml")
		if *updateGolden {
			Expect(os.WriteFile(golden, doc, 0o644)).To(Succeed())
		}
		want, err := os.ReadFile(golden)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(doc)).To(Equal(string(want)))

		By("running the Deployment with its config source, probes and credentials")
		var d appsv1.Deployment
		Eventually(func() error { return k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &d) }).Should(Succeed())
		Expect(*d.Spec.Replicas).To(Equal(int32(3)))
		c := d.Spec.Template.Spec.Containers[0]
		Expect(c.Image).To(Equal("tokenwarden:test"))
		Expect(c.Args).To(Equal([]string{"--configmap", ns + "/fleet-proxy"}))
		Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
		Expect(c.Env).To(ContainElement(HaveField("Name", "TOKENWARDEN_UPSTREAM_CLAUDE_KEY")))
		Expect(c.Env).To(ContainElement(Equal(corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}})),
			"the replica's report Lease is named after its pod, as its token's pod-name claim says")
		Expect(d.OwnerReferences).To(ContainElement(HaveField("Name", "fleet")), "a deleted TokenProxy takes its objects with it")

		By("letting the proxies read only their own ConfigMap, and create report Leases (renewing them by name: see the RBAC specs)")
		var role rbacv1.Role
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &role)).To(Succeed())
		Expect(role.Rules).To(Equal([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
			ResourceNames: []string{"fleet-proxy"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}}}))

		By("reporting each replica's allowance on the TokenBudgets and the fingerprint on the keys")
		Eventually(func(g Gomega) {
			st := budgetStatus(g, ns, "per-key")
			g.Expect(st.Replicas).To(Equal(int64(3)))
			g.Expect(st.PerReplica.TokensPerMinute).To(HaveValue(Equal(int64(20000))))
			g.Expect(st.PerReplica.TokensPerDay).To(HaveValue(Equal(int64(1666666))))
			g.Expect(condition(st.Conditions, "Ready").Status).To(Equal(metav1.ConditionTrue))
			g.Expect(condition(st.Conditions, "Ready").Message).To(ContainSubstring("each of the 3 replicas enforces 1/3 of it"))
			g.Expect(budgetStatus(g, ns, "global").PerReplica.TokensPerDay).To(BeNil(), "0 is unlimited")
			var k twv1alpha1.ApiKey
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "alice"}, &k)).To(Succeed())
			g.Expect(k.Status.Fingerprint).To(Equal(sha("sk-alice")[:8]))
			var tp twv1alpha1.TokenProxy
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet"}, &tp)).To(Succeed())
			g.Expect(tp.Status.Budgets).To(Equal(int32(3)))
			g.Expect(tp.Status.Keys).To(Equal(int32(2)))
			g.Expect(tp.Status.Selector).To(Equal("app.kubernetes.io/instance=fleet,app.kubernetes.io/name=tokenwarden-proxy"))
		}).Should(Succeed())
	})

	It("divides by the Deployment's replicas, surge included, and follows a scale", func() {
		ns := newNamespace("divide")
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "team", twv1alpha1.DimensionPerTeam, "", 120000, 0))).To(Succeed())
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 3))).To(Succeed())
		Eventually(func(g Gomega) { g.Expect(rendered(g, ns).RateLimiting.BudgetDivision.Replicas).To(Equal(int64(3))) }).Should(Succeed())

		By("a rolling update's surge pod (status.replicas above spec)")
		Eventually(func(g Gomega) {
			var d appsv1.Deployment
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &d)).To(Succeed())
			d.Status.Replicas = 4
			g.Expect(k8sClient.Status().Update(ctx, &d)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).RateLimiting.BudgetDivision.Replicas).To(Equal(int64(4)))
			g.Expect(budgetStatus(g, ns, "team").PerReplica.TokensPerMinute).To(HaveValue(Equal(int64(30000))))
		}).Should(Succeed())

		By("kubectl scale tp/fleet --replicas=6, through the scale subresource")
		var tp twv1alpha1.TokenProxy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet"}, &tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Replicas = ptr.To(int32(6))
		Expect(k8sClient.Patch(ctx, &tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			var d appsv1.Deployment
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &d)).To(Succeed())
			g.Expect(*d.Spec.Replicas).To(Equal(int32(6)))
			g.Expect(rendered(g, ns).RateLimiting.BudgetDivision.Replicas).To(Equal(int64(6)))
			g.Expect(budgetStatus(g, ns, "team").PerReplica.TokensPerMinute).To(HaveValue(Equal(int64(20000))))
		}).Should(Succeed())
	})

	It("keeps the oldest of two budgets on one dimension and marks the other Conflicted", func() {
		ns := newNamespace("conflict")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "first", twv1alpha1.DimensionGlobal, "", 1000, 0))).To(Succeed())
		time.Sleep(1100 * time.Millisecond) // creation timestamps have a resolution of one second
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "second", twv1alpha1.DimensionGlobal, "", 5000, 0))).To(Succeed())
		Eventually(func(g Gomega) {
			st := budgetStatus(g, ns, "second")
			acc := condition(st.Conditions, "Accepted")
			g.Expect(acc.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(acc.Reason).To(Equal("Conflicted"))
			g.Expect(acc.Message).To(Equal("TokenBudget first is older and sets the same dimension Global"))
			g.Expect(condition(budgetStatus(g, ns, "first").Conditions, "Accepted").Status).To(Equal(metav1.ConditionTrue))
			g.Expect(rendered(g, ns).RateLimiting.Limits.Global.TokensPerMinute).To(Equal(int64(1000)))
		}).Should(Succeed())

		By("a deleted budget leaving the config, and the other taking its place")
		Expect(k8sClient.Delete(ctx, tokenBudget(ns, "first", "", "", 0, 0))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).RateLimiting.Limits.Global.TokensPerMinute).To(Equal(int64(5000)))
			g.Expect(condition(budgetStatus(g, ns, "second").Conditions, "Accepted").Status).To(Equal(metav1.ConditionTrue))
		}).Should(Succeed())
	})

	It("renders a rotated Secret's new hash, and reports a missing Secret", func() {
		ns := newNamespace("rotate")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "alice", "alice", "alice", ""))).To(Succeed())
		Eventually(func(g Gomega) {
			var k twv1alpha1.ApiKey
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "alice"}, &k)).To(Succeed())
			acc := condition(k.Status.Conditions, "Accepted")
			g.Expect(acc.Reason).To(Equal("SecretNotFound"))
			g.Expect(acc.Message).To(Equal("No Secret alice labelled tokenwarden.io/secret=api-key in namespace " + ns))
			g.Expect(rendered(g, ns).APIKeys).To(BeEmpty())
		}).Should(Succeed())

		secret := keySecret(ns, "alice", "sk-old")
		Expect(k8sClient.Create(ctx, secret)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).APIKeys).To(ConsistOf(HaveField("KeySHA256", sha("sk-old"))))
		}).Should(Succeed())

		secret.StringData = map[string]string{"key": "sk-new"}
		Expect(k8sClient.Update(ctx, secret)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).APIKeys).To(ConsistOf(HaveField("KeySHA256", sha("sk-new"))))
		}).Should(Succeed())
	})

	It("manages the fleet's ServiceMonitor when asked, once its CRD is installed after the manager started", func() {
		ns := newNamespace("monitor")
		tp := fleetProxy(ns, 1)
		tp.Spec.ServiceMonitor = true
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(condition(proxyStatus(g, ns).Conditions, "Degraded").Status).To(Equal(metav1.ConditionFalse),
				"without the CRD there is nothing to do, and nothing failed")
		}).Should(Succeed())
		installServiceMonitorCRD()
		sm := &unstructured.Unstructured{}
		sm.SetGroupVersionKind(schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"})
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, sm)).To(Succeed())
			endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			g.Expect(endpoints).To(ConsistOf(HaveKeyWithValue("port", "admin")))
			g.Expect(sm.GetOwnerReferences()).To(ContainElement(HaveField("Name", "fleet")))
		}).Should(Succeed())

		By("a deleted ServiceMonitor coming back: the operator now watches the ones it owns")
		uid := sm.GetUID()
		Expect(k8sClient.Delete(ctx, sm)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, sm)).To(Succeed())
			g.Expect(sm.GetUID()).NotTo(Equal(uid))
		}).Should(Succeed())

		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.ServiceMonitor = false
		Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, sm))
		}).Should(BeTrue())
	})

	It("tells a budget whose TokenProxy does not exist", func() {
		ns := newNamespace("orphan")
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "lost", twv1alpha1.DimensionGlobal, "", 1000, 0))).To(Succeed())
		Eventually(func(g Gomega) {
			acc := condition(budgetStatus(g, ns, "lost").Conditions, "Accepted")
			g.Expect(acc.Reason).To(Equal("ProxyNotFound"))
			g.Expect(acc.Message).To(Equal("TokenProxy fleet not found"))
		}).Should(Succeed())
	})
})
