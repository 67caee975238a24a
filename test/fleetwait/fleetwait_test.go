// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package fleetwait_test

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/test/fleetwait"
)

// The operator's part is tested against the real operator where the tests use Wait
// (controllers/kubectl_test.go, test/e2e, test/demo). Here each state the operator
// passes through is written by hand, so that each answer Observed gives is seen.

func TestFleetwait(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "fleetwait Suite")
}

const ns = "team"

func ready(gen int64) []metav1.Condition {
	return []metav1.Condition{{Type: twv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: twv1alpha1.ReasonRendered, ObservedGeneration: gen}}
}

// observedFleet is a fleet the operator has fully observed: a TokenProxy, a budget and
// a key of it, a budget of another fleet, and the ConfigMap at generation 7.
func observedFleet() (*twv1alpha1.TokenProxy, *twv1alpha1.TokenBudget, *twv1alpha1.ApiKey, []client.Object) {
	tp := &twv1alpha1.TokenProxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fleet", Generation: 3},
		Status: twv1alpha1.TokenProxyStatus{ObservedGeneration: 3, Budgets: 1, Keys: 1}}
	b := &twv1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "per-key", Generation: 2},
		Spec:   twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}},
		Status: twv1alpha1.TokenBudgetStatus{ObservedGeneration: 2, Conditions: ready(2)}}
	k := &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alice", Generation: 1},
		Spec:   twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: "fleet"}},
		Status: twv1alpha1.ApiKeyStatus{ObservedGeneration: 1, Conditions: ready(1)}}
	other := &twv1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "elsewhere", Generation: 5},
		Spec: twv1alpha1.TokenBudgetSpec{ProxyRef: twv1alpha1.ProxyReference{Name: "other"}}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fleet-proxy",
		Annotations: map[string]string{twv1alpha1.ConfigGenerationAnnotation: "7"}}}
	return tp, b, k, []client.Object{other, cm}
}

func reader(objs ...client.Object) client.Reader {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(twv1alpha1.AddToScheme(scheme))
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

func at(g int64) fleetwait.Replica {
	return fleetwait.Replica{Name: "proxy 1", Generation: func(context.Context) (int64, error) { return g, nil }}
}

var _ = Describe("Observed and Target", func() {
	It("return the ConfigMap's generation once the operator has observed every object of the fleet", func(ctx SpecContext) {
		tp, b, k, rest := observedFleet()
		Expect(fleetwait.Observed(ctx, reader(append(rest, tp, b, k)...), ns, "fleet")).To(Succeed())
		Expect(fleetwait.Target(ctx, reader(append(rest, tp, b, k)...), ns, "fleet")).To(Equal(int64(7)))
	})

	DescribeTable("name what the operator has not observed yet",
		func(ctx SpecContext, change func(*twv1alpha1.TokenProxy, *twv1alpha1.TokenBudget, *twv1alpha1.ApiKey), message string) {
			tp, b, k, rest := observedFleet()
			change(tp, b, k)
			err := fleetwait.Observed(ctx, reader(append(rest, tp, b, k)...), ns, "fleet")
			Expect(err).To(MatchError(message))
		},
		Entry("an edit of the fleet (a scale) the operator has not rendered",
			func(tp *twv1alpha1.TokenProxy, _ *twv1alpha1.TokenBudget, _ *twv1alpha1.ApiKey) { tp.Generation = 4 },
			"the operator has not observed TokenProxy team/fleet: generation 4, status.observedGeneration 3"),
		Entry("an edit of a budget the operator has not rendered",
			func(_ *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget, _ *twv1alpha1.ApiKey) { b.Generation = 3 },
			"the operator has not observed TokenBudget team/per-key: generation 3, status.observedGeneration 2"),
		Entry("a key not rendered yet: no condition",
			func(_ *twv1alpha1.TokenProxy, _ *twv1alpha1.TokenBudget, k *twv1alpha1.ApiKey) {
				k.Status = twv1alpha1.ApiKeyStatus{ObservedGeneration: 1}
			},
			"ApiKey team/alice has no Ready condition yet"),
		Entry("a key observed before its Secret's event arrived",
			func(_ *twv1alpha1.TokenProxy, _ *twv1alpha1.TokenBudget, k *twv1alpha1.ApiKey) {
				k.Status.Conditions = []metav1.Condition{{Type: twv1alpha1.ConditionReady, Status: metav1.ConditionFalse,
					Reason: twv1alpha1.ReasonSecretNotFound, Message: "Not in the fleet's config: Secret alice-key not found", ObservedGeneration: 1}}
			},
			"ApiKey team/alice is not Ready: SecretNotFound: Not in the fleet's config: Secret alice-key not found"),
		Entry("a Ready condition left from an earlier generation",
			func(_ *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget, _ *twv1alpha1.ApiKey) {
				b.Status.Conditions = ready(1)
			},
			"the Ready condition of TokenBudget team/per-key is for generation 1, not 2"),
		Entry("a budget created since the fleet's status was written",
			func(tp *twv1alpha1.TokenProxy, _ *twv1alpha1.TokenBudget, _ *twv1alpha1.ApiKey) {
				tp.Status.Budgets = 0
			},
			"the operator has not rendered the latest TokenBudgets and ApiKeys of TokenProxy team/fleet: its status counts 0 budgets and 1 keys in force, 1 and 1 reference it"),
		Entry("a key deleted since the fleet's status was written",
			func(tp *twv1alpha1.TokenProxy, _ *twv1alpha1.TokenBudget, _ *twv1alpha1.ApiKey) { tp.Status.Keys = 2 },
			"the operator has not rendered the latest TokenBudgets and ApiKeys of TokenProxy team/fleet: its status counts 1 budgets and 2 keys in force, 1 and 1 reference it"),
	)

	It("says when the ConfigMap has no generation", func(ctx SpecContext) {
		tp, b, k, _ := observedFleet()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fleet-proxy"}}
		_, err := fleetwait.Target(ctx, reader(tp, b, k, cm), ns, "fleet")
		Expect(err).To(MatchError("ConfigMap team/fleet-proxy has no annotation tokenwarden.io/config-generation"))
	})
})

var _ = Describe("Lagging and Wait", func() {
	It("name the proxy that has not applied the fleet's generation, and what it has", func(ctx SpecContext) {
		Expect(fleetwait.Lagging(ctx, []fleetwait.Replica{at(7), at(8)}, 7)).To(Succeed())
		Expect(fleetwait.Lagging(ctx, []fleetwait.Replica{at(7), at(6)}, 7)).To(MatchError("proxy 1 has applied generation 6, the fleet's config is generation 7"))
		down := fleetwait.Replica{Name: "proxy 2", Generation: func(context.Context) (int64, error) { return 0, errors.New("connection refused") }}
		Expect(fleetwait.Lagging(ctx, []fleetwait.Replica{down}, 7)).To(MatchError("proxy 2: connection refused"))
	})

	It("returns the generation once every proxy has it", func(ctx SpecContext) {
		tp, b, k, rest := observedFleet()
		Expect(fleetwait.Wait(ctx, reader(append(rest, tp, b, k)...), ns, "fleet", []fleetwait.Replica{at(7), at(7)}, time.Minute)).To(Equal(int64(7)))
	})

	It("names the proxy that lagged when the time is up", func(ctx SpecContext) {
		tp, b, k, rest := observedFleet()
		_, err := fleetwait.Wait(ctx, reader(append(rest, tp, b, k)...), ns, "fleet", []fleetwait.Replica{at(7), at(6)}, 200*time.Millisecond)
		Expect(err).To(MatchError("fleet team/fleet does not enforce its current config after 200ms: proxy 1 has applied generation 6, the fleet's config is generation 7"))
	})
})
