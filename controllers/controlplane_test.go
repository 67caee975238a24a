// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var _ = Describe("The test control plane", func() {
	It("stores objects in a real API server and the manager's cache sees them (the ConfigMaps the operator manages)", func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "controlplane-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())

		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns.Name, Labels: map[string]string{"app.kubernetes.io/managed-by": "tokenwarden"}},
			Data:       map[string]string{"config.yaml": "listen: 127.0.0.1:8080\n"},
		}
		Expect(k8sClient.Create(ctx, cm)).To(Succeed())

		Eventually(func(g Gomega) {
			var got corev1.ConfigMap
			g.Expect(mgrClient.Get(ctx, client.ObjectKeyFromObject(cm), &got)).To(Succeed())
			g.Expect(got.Data).To(HaveKeyWithValue("config.yaml", "listen: 127.0.0.1:8080\n"))
		}).Should(Succeed())
	})

	It("refuses what the API server's own validation refuses", func() {
		bad := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "Not_A_DNS_Name", Namespace: "default"}}
		err := k8sClient.Create(ctx, bad)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("metadata.name"))
	})
})
