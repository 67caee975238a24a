// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("Observability", func() {
	It("logs every request, traces none and keeps 20 refusals per key unless told otherwise", func() {
		c, err := config.Parse([]byte(minimal))
		Expect(err).NotTo(HaveOccurred())
		o := c.Observability
		Expect(o.AccessLog.Disabled).To(BeFalse())
		Expect(o.AccessLog.Sample()).To(Equal(1.0))
		Expect(o.AccessLog.Buffer()).To(Equal(4096))
		Expect(o.Tracing.Enabled).To(BeFalse())
		Expect(o.RefusalAudit.Kept()).To(Equal(20))
	})

	It("reads the access log, tracing and audit settings", func() {
		c, err := config.Parse([]byte(minimal + `
observability:
  access_log: {sample_ratio: 0.25, fields: [status, decision, refusal], buffer_lines: 100}
  tracing: {enabled: true, protocol: http/protobuf, endpoint: "http://collector:4318", sample_ratio: 0.5, service_name: edge}
  refusal_audit: {per_key: -1}
`))
		Expect(err).NotTo(HaveOccurred())
		o := c.Observability
		Expect(o.AccessLog.Sample()).To(Equal(0.25))
		Expect(o.AccessLog.Buffer()).To(Equal(100))
		Expect(o.Tracing.Protocol).To(Equal(config.TracingHTTP))
		Expect(*o.Tracing.SampleRatio).To(Equal(0.5))
		Expect(o.RefusalAudit.Kept()).To(Equal(0), "-1 keeps none")
	})

	DescribeTable("refuses bad values, naming the field",
		func(block, field string) {
			_, err := config.Parse([]byte(minimal + "\nobservability:\n" + block + "\n"))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(field))
		},
		Entry("a sample ratio above 1", "  access_log: {sample_ratio: 1.5}", "observability.access_log.sample_ratio: must be a number from 0 to 1, got 1.5"),
		Entry("a negative buffer", "  access_log: {buffer_lines: -1}", "observability.access_log.buffer_lines"),
		Entry("a field the log does not have", "  access_log: {fields: [status, api_key_sha]}", `observability.access_log.fields[1]: must be one of route, method`),
		Entry("an unknown protocol", "  tracing: {enabled: true, protocol: thrift}", `observability.tracing.protocol: must be "grpc" or "http/protobuf", got "thrift"`),
		Entry("a negative trace ratio", "  tracing: {sample_ratio: -0.1}", "observability.tracing.sample_ratio"),
		Entry("an audit beyond its bound", "  refusal_audit: {per_key: 5000}", "observability.refusal_audit.per_key: must be from -1 (none) to 1000, got 5000"),
		Entry("a misspelt word", "  tracing: {enable: true}", "observability.tracing.enable: unknown field"),
	)

	It("names a change of tracing as one that takes a restart", func() {
		a, err := config.Parse([]byte(minimal))
		Expect(err).NotTo(HaveOccurred())
		b, err := config.Parse([]byte(minimal + "\nobservability:\n  tracing: {enabled: true}\n  access_log: {sample_ratio: 0.1}\n"))
		Expect(err).NotTo(HaveOccurred())
		Expect(config.RestartRequired(a, b)).To(Equal([]string{"observability.tracing"}), "the access log changes at once")
	})
})
