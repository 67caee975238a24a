// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

const ledgerEnv = "TOKENWARDEN_LEDGER_URL"

var _ = Describe("A fleet with a ledger", func() {
	It("renders the ledger, passes its URL from the Secret and spools to an emptyDir; without one, nothing of it", func() {
		ns := newNamespace("ledger")
		tp := fleetProxy(ns, 2)
		tp.Spec.Ledger = &twv1alpha1.LedgerSpec{
			URLSecretRef:  &twv1alpha1.SecretKeyReference{Name: "ledger-db", Key: "uri"},
			SpoolSize:     ptr.To(resource.MustParse("32Mi")),
			WhenSpoolFull: twv1alpha1.LedgerRefuse, FlushIntervalSeconds: 5,
		}
		for _, o := range []client.Object{
			credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}),
			tp,
		} {
			Expect(k8sClient.Create(ctx, o)).To(Succeed())
		}

		By("a missing URL Secret: the fleet is not Accepted, and the field is named")
		Eventually(func(g Gomega) {
			acc := condition(proxyStatus(g, ns).Conditions, "Accepted")
			g.Expect(acc.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(acc.Message).To(HavePrefix("No Secret ledger-db labelled tokenwarden.io/secret=credential (spec.ledger.urlSecretRef)"))
		}).Should(Succeed())

		By("the Secret created: the document and the pods")
		Expect(k8sClient.Create(ctx, credentialSecret(ns, "ledger-db", map[string]string{"uri": "postgres://tw:pw@pg:5432/ledger"}))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(condition(proxyStatus(g, ns).Conditions, "Accepted").Status).To(Equal(metav1.ConditionTrue))
			g.Expect(rendered(g, ns).Ledger).To(Equal(config.Ledger{URLEnv: ledgerEnv, Fleet: ns + "/fleet",
				SpoolDir: "/var/spool/tokenwarden/ledger", SpoolBytes: 32 << 20, FlushIntervalSeconds: 5, WhenFull: config.LedgerRefuse}))
			g.Expect(string(document(g, ns))).NotTo(ContainSubstring("postgres://"), "the URL and its password stay in the Secret")
			pod := deployment(g, ns).Spec.Template.Spec
			env := map[string]*corev1.EnvVarSource{}
			for _, e := range pod.Containers[0].Env {
				env[e.Name] = e.ValueFrom
			}
			g.Expect(env).To(HaveKey(ledgerEnv))
			g.Expect(env[ledgerEnv].SecretKeyRef.Name).To(Equal("ledger-db"))
			g.Expect(env[ledgerEnv].SecretKeyRef.Key).To(Equal("uri"))
			g.Expect(pod.Volumes).To(ConsistOf(HaveField("Name", "ledger-spool")))
			g.Expect(pod.Volumes[0].EmptyDir.SizeLimit.String()).To(Equal("64Mi"), "twice the spool")
			g.Expect(pod.Containers[0].VolumeMounts).To(Equal([]corev1.VolumeMount{{Name: "ledger-spool", MountPath: "/var/spool/tokenwarden/ledger"}}))
		}).Should(Succeed())

		By("the ledger disabled: no ledger in the document, no variable, no volume")
		Eventually(func(g Gomega) error {
			var live twv1alpha1.TokenProxy
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), &live)).To(Succeed())
			live.Spec.Ledger.Disabled = true
			return k8sClient.Update(ctx, &live)
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(rendered(g, ns).Ledger).To(Equal(config.Ledger{}))
			pod := deployment(g, ns).Spec.Template.Spec
			g.Expect(pod.Volumes).To(BeEmpty())
			g.Expect(pod.Containers[0].Env).NotTo(ContainElement(HaveField("Name", ledgerEnv)))
		}).Should(Succeed())
	})
})
