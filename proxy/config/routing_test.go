// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("The admission policy", func() {
	DescribeTable("in force for a model: its own, else the fleet's, else refuse",
		func(fleet, own string, want config.AdmissionPolicy) {
			c, err := config.Parse([]byte(registryDoc + "  admission_policy: " + own + "\nrouting: {admission_policy: " + fleet + "}\n"))
			Expect(err).NotTo(HaveOccurred())
			Expect(c.Admission(&c.Models[0])).To(Equal(want))
		},
		Entry("neither names one", `""`, `""`, config.AdmitRefuse),
		Entry("the fleet's", "clamp", `""`, config.AdmitClamp),
		Entry("the model's over the fleet's", "clamp", "refuse", config.AdmitRefuse),
		Entry("the model's alone", `""`, "clamp", config.AdmitClamp),
	)

	DescribeTable("refuses a policy it does not know, naming the field",
		func(extra, want string) {
			_, err := config.Parse([]byte(registryDoc + extra))
			Expect(err).To(MatchError(ContainSubstring(want)))
		},
		Entry("the fleet's", "routing: {admission_policy: truncate}\n", "routing.admission_policy"),
		Entry("a model's", "  admission_policy: truncate\n", "models[0].admission_policy"),
	)
})

var _ = Describe("A model's unavailable_fallback", func() {
	DescribeTable("is refused unless it names another model of the registry, naming the field",
		func(extra, want string) {
			_, err := config.Parse([]byte(registryDoc + extra))
			Expect(err).To(MatchError(ContainSubstring(want)))
		},
		Entry("itself", "  unavailable_fallback: gpt-4o\n", `models[0].unavailable_fallback: "gpt-4o" is the model itself`),
		Entry("a model not in models", "  unavailable_fallback: llama\n", `models[0].unavailable_fallback: "llama" is not a model of models with upstreams`),
		Entry("a model without upstreams", "  unavailable_fallback: mini\n- {name: mini, context_window: 1000}\n", `"mini" is not a model of models with upstreams`),
		Entry("on a model the registry does not route", "- {name: m, unavailable_fallback: gpt-4o}\n", `models[1].unavailable_fallback: model "m" has no upstreams of its own here`),
	)

	It("accepts another registered model", func() {
		c, err := config.Parse([]byte(registryDoc + "  unavailable_fallback: mini\n- {name: mini, upstreams: [{upstream: openai-b}]}\n"))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Models[0].UnavailableFallback).To(Equal("mini"))
	})
})
