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
