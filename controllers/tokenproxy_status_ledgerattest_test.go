// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

var _ = Describe("The fleet's attestation of lost counters from its spend ledger", func() {
	It("is ordered only once every live replica's ledger is flushed past the loss, never for a store check's fence, and ends with the new epoch", func() {
		ns := newNamespace("ledgerattest")
		tp := redisFleet(ns, 2)
		tp.Spec.Ledger = &twv1alpha1.LedgerSpec{URLSecretRef: &twv1alpha1.SecretKeyReference{Name: "ledger-db", Key: "url"}}
		for _, o := range []client.Object{
			credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}),
			credentialSecret(ns, "ledger-db", map[string]string{"url": "postgres://tw:pw@pg:5432/ledger"}),
			tp,
		} {
			Expect(k8sClient.Create(ctx, o)).To(Succeed())
		}
		group := ns + "/fleet"
		now := time.Now()
		lost := fmt.Sprintf("%d-aa", now.Add(-time.Hour).UnixMilli())
		report := func(replica, epochs string, flushed time.Time) {
			GinkgoHelper()
			name := "fleet-proxy-" + replica
			renewed := metav1.NewMicroTime(time.Now())
			ann := map[string]string{twv1alpha1.ReplicaGenerationAnnotation: "1", twv1alpha1.ReplicaDigestAnnotation: "x",
				twv1alpha1.ReplicaDurableEpochsAnnotation: epochs,
				twv1alpha1.ReplicaLedgerAnnotation:        fmt.Sprintf(`{"spool_batches":0,"spool_bytes":0,"flushed_through":%q}`, flushed.UTC().Format(time.RFC3339Nano))}
			var le coordinationv1.Lease
			if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &le); err == nil {
				le.Annotations, le.Spec.RenewTime = ann, &renewed
				Expect(k8sClient.Update(ctx, &le)).To(Succeed())
				return
			}
			Expect(k8sClient.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
					Labels: map[string]string{twv1alpha1.ReplicaConfigMapLabel: "fleet-proxy"}, Annotations: ann},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(replica), LeaseDurationSeconds: ptr.To(int32(600)), RenewTime: &renewed},
			})).To(Succeed())
		}
		trusted := fmt.Sprintf(`[{"group":%q,"epoch":%q}]`, group, lost)
		fencedAt := now.Add(-time.Minute)
		fenced := fmt.Sprintf(`[{"group":%q,"epoch":%q,"fenced":true,"fenced_at":%d}]`, group, lost, fencedAt.UnixMilli())
		order := func(g Gomega) *twv1alpha1.LedgerAttestation {
			eps := proxyStatus(g, ns).DurableEpochs
			g.Expect(eps).To(HaveLen(1))
			return eps[0].LedgerAttestation
		}
		fenceMessage := func(g Gomega) string {
			return verdictOf(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionDurableBudgetsFenced).Message
		}

		report("r1", trusted, now)
		report("r2", trusted, now)
		Eventually(func(g Gomega) string { return rendered(g, ns).RateLimiting.Redis.Epoch }, enforceTimeout).Should(Equal(lost))

		By("Redis lost the counters; replica r2 has not flushed its ledger past the loss and the grace")
		report("r1", fenced, now)
		report("r2", fenced, fencedAt.Add(10*time.Second))
		Eventually(fenceMessage, enforceTimeout).Should(ContainSubstring("not yet: replica r2 has flushed its ledger only through"))
		Consistently(order, 2*time.Second).Should(BeNil())
		Expect(rendered(Default, ns).RateLimiting.Redis.LedgerAttestation).To(BeNil())

		By("r2 flushed past them: the order, in status and in the config, and an event")
		report("r2", fenced, now.Add(time.Second))
		Eventually(order, enforceTimeout).ShouldNot(BeNil())
		Expect(order(Default).FlushedThrough.Time).To(BeTemporally("==", now.Truncate(time.Second)), "the least of the two, in whole seconds")
		Eventually(func(g Gomega) {
			la := rendered(g, ns).RateLimiting.Redis.LedgerAttestation
			g.Expect(la).NotTo(BeNil())
			g.Expect(la.Epoch).To(Equal(lost))
			g.Expect(la.FlushedThroughMillis).To(Equal(now.Truncate(time.Second).UnixMilli()))
		}, enforceTimeout).Should(Succeed())
		Expect(fenceMessage(Default)).To(ContainSubstring("one replica attests the balances from the ledger now"))
		Eventually(func(g Gomega) []string { return normalReasons(g, ns) }, enforceTimeout).Should(ContainElement(twv1alpha1.ReasonAttestingFromLedger))

		By("a store check fences r1 as well: no order")
		report("r1", fmt.Sprintf(`[{"group":%q,"epoch":%q,"fenced":true,"fenced_at":%d,"store_fence":"maxmemory_policy: allkeys-lru"}]`,
			group, lost, fencedAt.UnixMilli()), now.Add(time.Second))
		Eventually(order, enforceTimeout).Should(BeNil())
		Eventually(func(g Gomega) any { return rendered(g, ns).RateLimiting.Redis.LedgerAttestation }, enforceTimeout).Should(BeNil())

		By("the store fixed, the order again; then a replica attests: its new epoch is recorded and the order is gone")
		report("r1", fenced, now.Add(time.Second))
		Eventually(order, enforceTimeout).ShouldNot(BeNil())
		next := fmt.Sprintf("%d-bb", time.Now().UnixMilli())
		report("r1", fmt.Sprintf(`[{"group":%q,"epoch":%q}]`, group, next), now.Add(2*time.Second))
		report("r2", fmt.Sprintf(`[{"group":%q,"epoch":%q,"fenced":true,"found":%q,"fenced_at":%d}]`, group, lost, next, fencedAt.UnixMilli()), now.Add(2*time.Second))
		Eventually(func(g Gomega) string { return rendered(g, ns).RateLimiting.Redis.Epoch }, enforceTimeout).Should(Equal(next))
		Expect(order(Default)).To(BeNil())
		Expect(rendered(Default, ns).RateLimiting.Redis.LedgerAttestation).To(BeNil())
		Eventually(func(g Gomega) []string { return normalReasons(g, ns) }, enforceTimeout).Should(ContainElement(twv1alpha1.ReasonAttestedFromLedger))
	})
})

// normalReasons are the reasons of the normal events recorded in a namespace.
func normalReasons(g Gomega, ns string) []string {
	var evs corev1.EventList
	g.Expect(k8sClient.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
	var reasons []string
	for _, e := range evs.Items {
		if e.Type == corev1.EventTypeNormal {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}
