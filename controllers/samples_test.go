// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
)

var _ = Describe("config/samples", func() {
	It("applies as a working set: the fleet renders both keys and each replica's allowance", func() {
		ns := newNamespace("samples")
		files, err := filepath.Glob(filepath.Join("..", "config", "samples", "tokenwarden_*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(files).To(HaveLen(3))
		for _, f := range files {
			data, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
			for {
				var u unstructured.Unstructured
				if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
					break
				} else {
					Expect(err).NotTo(HaveOccurred(), f)
				}
				if len(u.Object) == 0 {
					continue
				}
				u.SetNamespace(ns)
				Expect(k8sClient.Create(ctx, &u)).To(Succeed(), "%s: %s", f, u.GetName())
			}
		}
		Eventually(func(g Gomega) {
			c := rendered(g, ns)
			g.Expect(c.APIKeys).To(HaveLen(2))
			g.Expect(c.RateLimiting.BudgetDivision.Replicas).To(Equal(int64(3)))
			st := budgetStatus(g, ns, "per-key")
			g.Expect(st.PerReplica.TokensPerMinute).To(HaveValue(Equal(int64(10000))))
			g.Expect(st.PerReplica.TokensPerDay).To(HaveValue(Equal(int64(666666))))
			g.Expect(condition(budgetStatus(g, ns, "research-team").Conditions, "Ready").Status).To(Equal(metav1.ConditionTrue))
		}).Should(Succeed())
	})
})
