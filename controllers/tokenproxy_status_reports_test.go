// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"context"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// replicaLease is the report Lease a proxy replica of the fleet writes (proxy/report):
// here the test plays the replicas.
func replicaLease(ns, replica string, generation int64, digest string, renewed time.Time, duration time.Duration) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: "fleet-proxy-" + replica, Namespace: ns,
			Labels:      map[string]string{twv1alpha1.ReplicaConfigMapLabel: "fleet-proxy"},
			Annotations: map[string]string{twv1alpha1.ReplicaGenerationAnnotation: strconv.FormatInt(generation, 10), twv1alpha1.ReplicaDigestAnnotation: digest},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(replica), RenewTime: ptr.To(metav1.NewMicroTime(renewed)),
			LeaseDurationSeconds: ptr.To(int32(duration / time.Second)),
		},
	}
}

// currentDoc is the generation and digest of the fleet's ConfigMap: what a replica
// that has loaded it reports.
func currentDoc(ns string) (int64, string) {
	GinkgoHelper()
	var cm corev1.ConfigMap
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &cm)).To(Succeed())
	g, err := strconv.ParseInt(cm.Annotations[twv1alpha1.ConfigGenerationAnnotation], 10, 64)
	Expect(err).NotTo(HaveOccurred())
	return g, config.Digest(document(Default, ns))
}

// loadCurrent is a replica that has loaded the fleet's current config. It stays live
// for the whole spec without renewing (ten minutes): a loaded machine may take longer
// than a real replica's 15 s between two reconciles of a large fleet, and a spec about
// expiry writes its own short Lease.
func loadCurrent(ns, replica string) *coordinationv1.Lease {
	GinkgoHelper()
	g, digest := currentDoc(ns)
	return replicaLease(ns, replica, g, digest, time.Now(), 10*time.Minute)
}

// reportCurrent is a replica loading the fleet's current config: its Lease's
// annotations.
func reportCurrent(ns, replica string) {
	GinkgoHelper()
	generation, digest := currentDoc(ns)
	Eventually(func(g Gomega) {
		var le coordinationv1.Lease
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy-" + replica}, &le)).To(Succeed())
		le.Annotations[twv1alpha1.ReplicaGenerationAnnotation] = strconv.FormatInt(generation, 10)
		le.Annotations[twv1alpha1.ReplicaDigestAnnotation] = digest
		le.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		g.Expect(k8sClient.Update(ctx, &le)).To(Succeed())
	}).Should(Succeed())
}

func proxyStatus(g Gomega, ns string) twv1alpha1.TokenProxyStatus {
	var tp twv1alpha1.TokenProxy
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet"}, &tp)).To(Succeed())
	return tp.Status
}

func keyObject(g Gomega, ns, name string) *twv1alpha1.ApiKey {
	var k twv1alpha1.ApiKey
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &k)).To(Succeed())
	return &k
}

func budgetObject(g Gomega, ns, name string) *twv1alpha1.TokenBudget {
	var b twv1alpha1.TokenBudget
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &b)).To(Succeed())
	return &b
}

// enforced is an Enforced condition as the tests compare it.
type enforced = verdict

func enforcedOf(conds []metav1.Condition) enforced {
	return verdictOf(conds, twv1alpha1.ConditionEnforced)
}

var _ = Describe("Enforced, from the replicas' reports", func() {
	It("is True only when every live replica has loaded the config that holds the object", func() {
		ns := newNamespace("enforced")
		Expect(k8sClient.Create(ctx, keySecret(ns, "alice", "sk-alice"))).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "alice", "alice", "alice", "research"))).To(Succeed())
		Expect(k8sClient.Create(ctx, tokenBudget(ns, "per-key", twv1alpha1.DimensionPerAPIKey, "", 60000, 0))).To(Succeed())
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 2))).To(Succeed())

		By("no replica reporting: nothing is enforced")
		var g1 int64
		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			g.Expect(st.Keys).To(Equal(int32(1)))
			g.Expect(st.Budgets).To(Equal(int32(1)))
			g1 = st.ConfigGeneration
			g.Expect(st.Enforced).To(Equal("0/0"))
			g.Expect(enforcedOf(st.Conditions)).To(Equal(enforced{metav1.ConditionFalse, "NoReplicas",
				"No proxy replica reports: no renewed Lease labelled tokenwarden.io/configmap"}))
			b := budgetObject(g, ns, "per-key")
			g.Expect(b.Status.ConfigGeneration).To(Equal(g1))
			g.Expect(enforcedOf(b.Status.Conditions)).To(Equal(enforced{metav1.ConditionFalse, "Pending",
				"In config generation " + strconv.FormatInt(g1, 10) + "; no proxy replica reports (no renewed report Lease)"}))
		}).Should(Succeed())

		By("two replicas reporting the current generation")
		Expect(k8sClient.Create(ctx, loadCurrent(ns, "a"))).To(Succeed())
		Expect(k8sClient.Create(ctx, loadCurrent(ns, "b"))).To(Succeed())
		var budgetRV, keyRV string
		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			g.Expect(st.LiveReplicas).To(Equal(int32(2)))
			g.Expect(st.EnforcedReplicas).To(Equal(int32(2)))
			g.Expect(st.Enforced).To(Equal("2/2"))
			g.Expect(enforcedOf(st.Conditions)).To(Equal(enforced{metav1.ConditionTrue, "AllReplicasCurrent",
				"All 2 live replicas have loaded config generation " + strconv.FormatInt(g1, 10)}))
			b := budgetObject(g, ns, "per-key")
			g.Expect(enforcedOf(b.Status.Conditions)).To(HaveField("Reason", "Enforced"))
			k := keyObject(g, ns, "alice")
			g.Expect(k.Status.ConfigGeneration).To(Equal(g1))
			g.Expect(enforcedOf(k.Status.Conditions)).To(Equal(enforced{metav1.ConditionTrue, "Enforced",
				"Every live proxy replica has loaded config generation " + strconv.FormatInt(g1, 10) + " or later, which holds this key"}))
			budgetRV, keyRV = b.ResourceVersion, k.ResourceVersion
		}).Should(Succeed())

		By("a scale step: a third replica writes only the fleet's status")
		Expect(k8sClient.Create(ctx, loadCurrent(ns, "c"))).To(Succeed())
		Eventually(func(g Gomega) { g.Expect(proxyStatus(g, ns).Enforced).To(Equal("3/3")) }).Should(Succeed())
		// The budgets and keys are written before the fleet in a reconcile.
		Expect(budgetObject(Default, ns, "per-key").ResourceVersion).To(Equal(budgetRV), "a scale step must not rewrite a budget")
		Expect(keyObject(Default, ns, "alice").ResourceVersion).To(Equal(keyRV), "a scale step must not rewrite a key")

		By("an edit of the budget: pending until every replica has loaded it; the key stays enforced")
		b := budgetObject(Default, ns, "per-key")
		patch := client.MergeFrom(b.DeepCopy())
		b.Spec.TokensPerMinute = 30000
		Expect(k8sClient.Patch(ctx, b, patch)).To(Succeed())
		var g2 int64
		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			g.Expect(st.ConfigGeneration).To(BeNumerically(">", g1))
			g2 = st.ConfigGeneration
			g.Expect(st.Enforced).To(Equal("0/3"))
			g.Expect(enforcedOf(st.Conditions)).To(Equal(enforced{metav1.ConditionFalse, "ReplicasBehind",
				"0 of 3 live replicas have loaded config generation " + strconv.FormatInt(g2, 10) + "; replica a has loaded generation " + strconv.FormatInt(g1, 10)}))
			b := budgetObject(g, ns, "per-key")
			g.Expect(b.Status.ConfigGeneration).To(Equal(g2))
			g.Expect(enforcedOf(b.Status.Conditions)).To(Equal(enforced{metav1.ConditionFalse, "Pending",
				"In config generation " + strconv.FormatInt(g2, 10) + "; replica a has loaded generation " + strconv.FormatInt(g1, 10)}))
		}).Should(Succeed())
		Expect(keyObject(Default, ns, "alice").ResourceVersion).To(Equal(keyRV), "another object's edit leaves the key alone")

		reportCurrent(ns, "a")
		reportCurrent(ns, "b")
		Eventually(func(g Gomega) {
			g.Expect(proxyStatus(g, ns).Enforced).To(Equal("2/3"))
			g.Expect(enforcedOf(budgetObject(g, ns, "per-key").Status.Conditions)).To(Equal(enforced{metav1.ConditionFalse, "Pending",
				"In config generation " + strconv.FormatInt(g2, 10) + "; replica c has loaded generation " + strconv.FormatInt(g1, 10)}),
				"the message names the replica behind")
		}).Should(Succeed())
		reportCurrent(ns, "c")
		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			g.Expect(st.Enforced).To(Equal("3/3"))
			g.Expect(enforcedOf(st.Conditions)).To(HaveField("Reason", "AllReplicasCurrent"))
			g.Expect(enforcedOf(budgetObject(g, ns, "per-key").Status.Conditions)).To(HaveField("Status", metav1.ConditionTrue))
		}).Should(Succeed())

		By("a replica that reports the current generation with another document is behind")
		Expect(k8sClient.Create(ctx, replicaLease(ns, "f", g2, "not-the-operators", time.Now(), 15*time.Second))).To(Succeed())
		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			g.Expect(st.Enforced).To(Equal("3/4"))
			g.Expect(enforcedOf(st.Conditions).Message).To(HaveSuffix(
				"replica f has loaded a document other than the operator's as generation " + strconv.FormatInt(g2, 10)))
		}).Should(Succeed())
		Expect(k8sClient.Delete(ctx, replicaLease(ns, "f", 0, "", time.Now(), 0))).To(Succeed())
		Eventually(func(g Gomega) { g.Expect(proxyStatus(g, ns).Enforced).To(Equal("3/3")) }).Should(Succeed())

		By("a replica that stops renewing: it counts while its Lease runs, then drops out and its Lease is deleted")
		Expect(k8sClient.Create(ctx, replicaLease(ns, "d", 0, "", time.Now(), 5*time.Second))).To(Succeed())
		Eventually(func(g Gomega) {
			st := proxyStatus(g, ns)
			g.Expect(st.Enforced).To(Equal("3/4"))
			g.Expect(enforcedOf(st.Conditions).Message).To(HaveSuffix("replica d has loaded generation 0"))
			g.Expect(enforcedOf(budgetObject(g, ns, "per-key").Status.Conditions)).To(HaveField("Reason", "Pending"))
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(proxyStatus(g, ns).Enforced).To(Equal("3/3"))
			g.Expect(enforcedOf(budgetObject(g, ns, "per-key").Status.Conditions)).To(HaveField("Reason", "Enforced"))
			err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy-d"}, &coordinationv1.Lease{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the operator deletes an expired Lease: %v", err)
		}).Should(Succeed())

		By("a Lease that arrives expired never counts, and is deleted when it is not renewed for its duration")
		Expect(k8sClient.Create(ctx, replicaLease(ns, "e", 0, "", time.Now().Add(-time.Minute), 2*time.Second))).To(Succeed())
		Consistently(func(g Gomega) { g.Expect(proxyStatus(g, ns).Enforced).To(Equal("3/3")) }, time.Second).Should(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy-e"}, &coordinationv1.Lease{}))
		}).Should(BeTrue())
		Expect(proxyStatus(Default, ns).Enforced).To(Equal("3/3"))

	})

	It("counts a replica whose clock runs an hour behind while it renews, by the operator's clock, and deletes it when it stops", func() {
		ns := newNamespace("enforced-skew")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func(g Gomega) { g.Expect(proxyStatus(g, ns).ConfigGeneration).NotTo(BeZero()) }).Should(Succeed())
		generation, digest := currentDoc(ns)
		behind := time.Now().Add(-time.Hour)
		skewed := replicaLease(ns, "s", generation, digest, behind, 2*time.Second)
		Expect(k8sClient.Create(ctx, skewed)).To(Succeed())
		renewing, stop := context.WithCancel(ctx)
		defer stop()
		go func() {
			defer GinkgoRecover()
			for t := 1; renewing.Err() == nil; t++ {
				select {
				case <-renewing.Done():
					return
				case <-time.After(500 * time.Millisecond):
				}
				var le coordinationv1.Lease
				if k8sClient.Get(renewing, client.ObjectKeyFromObject(skewed), &le) != nil {
					continue
				}
				le.Spec.RenewTime = ptr.To(metav1.NewMicroTime(behind.Add(time.Duration(t) * 500 * time.Millisecond)))
				_ = k8sClient.Update(renewing, &le)
			}
		}()
		Eventually(func(g Gomega) { g.Expect(proxyStatus(g, ns).Enforced).To(Equal("1/1")) }).Should(Succeed())
		Consistently(func(g Gomega) { g.Expect(proxyStatus(g, ns).Enforced).To(Equal("1/1")) }, 4*time.Second).Should(Succeed())
		stop()
		Eventually(func(g Gomega) {
			g.Expect(proxyStatus(g, ns).Enforced).To(Equal("0/0"))
			err := k8sClient.Get(ctx, client.ObjectKeyFromObject(skewed), &coordinationv1.Lease{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a replica that stopped renewing is deleted: %v", err)
		}).Should(Succeed())
	})

	It("takes a rotated Secret as new content of the key: pending until every replica has loaded the new hash", func() {
		ns := newNamespace("enforced-rotate")
		secret := keySecret(ns, "alice", "sk-old")
		Expect(k8sClient.Create(ctx, secret)).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "alice", "alice", "alice", ""))).To(Succeed())
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		var g1 int64
		Eventually(func(g Gomega) {
			k := keyObject(g, ns, "alice")
			g.Expect(k.Status.ConfigGeneration).NotTo(BeZero())
			g1 = k.Status.ConfigGeneration
		}).Should(Succeed())
		Expect(k8sClient.Create(ctx, loadCurrent(ns, "a"))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(enforcedOf(keyObject(g, ns, "alice").Status.Conditions)).To(HaveField("Reason", "Enforced"))
		}).Should(Succeed())

		secret.StringData = map[string]string{"key": "sk-new"}
		Expect(k8sClient.Update(ctx, secret)).To(Succeed())
		var g2 int64
		Eventually(func(g Gomega) {
			k := keyObject(g, ns, "alice")
			g.Expect(k.Status.Fingerprint).To(Equal(sha("sk-new")[:8]))
			g.Expect(k.Status.ConfigGeneration).To(BeNumerically(">", g1), "the new hash is new content, in a new generation")
			g2 = k.Status.ConfigGeneration
			g.Expect(enforcedOf(k.Status.Conditions)).To(Equal(enforced{metav1.ConditionFalse, "Pending",
				"In config generation " + strconv.FormatInt(g2, 10) + "; replica a has loaded generation " + strconv.FormatInt(g1, 10)}))
		}).Should(Succeed())
		reportCurrent(ns, "a")
		Eventually(func(g Gomega) {
			g.Expect(enforcedOf(keyObject(g, ns, "alice").Status.Conditions)).To(HaveField("Reason", "Enforced"))
		}).Should(Succeed())
	})

	It("tells a key that is not in the config", func() {
		ns := newNamespace("notinconfig")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Expect(k8sClient.Create(ctx, apiKey(ns, "bob", "bob", "bob", ""))).To(Succeed())
		Expect(k8sClient.Create(ctx, replicaLease(ns, "a", 1, "", time.Now(), 15*time.Second))).To(Succeed())
		Eventually(func(g Gomega) {
			k := keyObject(g, ns, "bob")
			g.Expect(k.Status.ConfigGeneration).To(BeZero())
			g.Expect(enforcedOf(k.Status.Conditions)).To(Equal(enforced{metav1.ConditionFalse, "NotInConfig",
				"Not in the fleet's config: No Secret bob labelled tokenwarden.io/secret=api-key in namespace " + ns}))
		}).Should(Succeed())
	})
})
