// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("The fleet's observability, as the TokenProxy sets it", func() {
	It("renders tracing, the access log's sampling and the refusal audit into the proxies' document", func() {
		ns := newNamespace("observability")
		tp := fleetProxy(ns, 1)
		tp.Spec.Observability = &twv1alpha1.ObservabilitySpec{
			RefusalsPerKey: 50,
			AccessLog:      &twv1alpha1.AccessLogSpec{SampleRatio: ptr.To(resource.MustParse("0.1"))},
			Tracing: &twv1alpha1.TracingSpec{Enabled: true, Protocol: twv1alpha1.TracingHTTP,
				Endpoint: "http://otel-collector.monitoring:4318", SampleRatio: ptr.To(resource.MustParse("0.25")), ServiceName: "edge"},
		}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			o := rendered(g, ns).Observability
			g.Expect(o.Tracing).To(HaveField("Enabled", true))
			g.Expect(o.Tracing.Protocol).To(Equal(config.TracingHTTP))
			g.Expect(o.Tracing.Endpoint).To(Equal("http://otel-collector.monitoring:4318"))
			g.Expect(o.Tracing.SampleRatio).To(HaveValue(Equal(0.25)))
			g.Expect(o.Tracing.ServiceName).To(Equal("edge"))
			g.Expect(o.AccessLog.Sample()).To(Equal(0.1))
			g.Expect(o.RefusalAudit.Kept()).To(Equal(50))
		}).Should(Succeed())
	})

	DescribeTable("refuses a bad value with the API server's message",
		func(o *twv1alpha1.ObservabilitySpec, message string) {
			tp := fleetProxy(newNamespace("observability-bad"), 1)
			tp.Spec.Observability = o
			err := k8sClient.Create(ctx, tp)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("a trace sample ratio above 1",
			&twv1alpha1.ObservabilitySpec{Tracing: &twv1alpha1.TracingSpec{SampleRatio: ptr.To(resource.MustParse("2"))}},
			"spec.observability.tracing.sampleRatio: Invalid value: \"2\": sampleRatio must be from 0 to 1"),
		Entry("an unknown protocol",
			&twv1alpha1.ObservabilitySpec{Tracing: &twv1alpha1.TracingSpec{Protocol: "thrift"}},
			`spec.observability.tracing.protocol: Unsupported value: "thrift": supported values: "grpc", "http/protobuf"`),
		Entry("an audit beyond its bound",
			&twv1alpha1.ObservabilitySpec{RefusalsPerKey: 5000},
			"spec.observability.refusalsPerKey: Invalid value: 5000: spec.observability.refusalsPerKey in body should be less than or equal to 1000"),
	)
})
