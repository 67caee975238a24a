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

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("config/samples", func() {
	It("applies as a working set: the fleet renders both keys, each replica's allowance and the rule-shaped budgets", func() {
		ns := newNamespace("samples")
		files, err := filepath.Glob(filepath.Join("..", "config", "samples", "tokenwarden_*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(files).To(HaveLen(5))
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

			// The rule-shaped budgets: a team default with research's own, and a
			// warn budget, on the memory fleet.
			g.Expect(ruleNames(c.RateLimiting.Rules)).To(Equal([]string{ns + "/research-daily", ns + "/teams-daily", ns + "/users-warn"}))
			g.Expect(c.RateLimiting.Rules[2].Action).To(Equal(config.ActionWarn))
			g.Expect(budgetStatus(g, ns, "users-warn").Summary.PerReplica).To(Equal("6666/min burst 20s"))
			g.Expect(budgetStatus(g, ns, "research-daily").Summary.Subjects).To(Equal("research"))

			// The cost budgets on the Redis fleet, priced from its models.
			rc, err := config.Parse(fleetDocument(g, ns, "fleet-redis"))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ruleNames(rc.RateLimiting.Rules)).To(Equal([]string{ns + "/key-gpt-4o-dollars", ns + "/research-dollars"}))
			g.Expect(rc.Models).To(HaveLen(2))
			g.Expect(budgetStatus(g, ns, "key-gpt-4o-dollars").Summary.Windows).To(Equal("$25/month, $0.50/min"))
			g.Expect(budgetStatus(g, ns, "research-dollars").Summary.Windows).To(Equal("$1000/month Europe/Berlin"))
			for _, name := range []string{"teams-daily", "research-daily", "users-warn", "key-gpt-4o-dollars", "research-dollars"} {
				g.Expect(condition(budgetStatus(g, ns, name).Conditions, "Accepted").Reason).To(Equal("Accepted"), name)
			}
		}).Should(Succeed())
	})
})
