// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// podNameExtra is the user extra a pod-bound ServiceAccount token carries: the pod's name.
const podNameExtra = "authentication.kubernetes.io/pod-name"

// asServiceAccount is a client that the API server takes for the ServiceAccount
// ns/name; with pod set, for a token bound to that pod, as a pod's projected token is;
// with groups, also a member of those (system:masters: RBAC allows everything).
func asServiceAccount(ns, name, pod string, groups ...string) client.Client {
	GinkgoHelper()
	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + name, Groups: groups}
	if pod != "" {
		as.Impersonate.Extra = map[string][]string{podNameExtra: {pod}}
	}
	c, err := client.New(as, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// reportLease is a Lease as a replica creates it, with the given labels.
func reportLease(ns, name string, labels map[string]string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name),
			RenewTime: ptr.To(metav1.NewMicroTime(time.Now())), LeaseDurationSeconds: ptr.To(int32(60))}}
}

// refusedByPolicy matches the error of a create that the report Lease policy denied
// with a message containing msg.
func refusedByPolicy(msg string) OmegaMatcher {
	return SatisfyAll(
		WithTransform(apierrors.IsForbidden, BeTrue()),
		MatchError(ContainSubstring("ValidatingAdmissionPolicy 'proxy-report-lease'")),
		MatchError(ContainSubstring(msg)))
}

var _ = Describe("The report Lease admission policy (config/admission)", func() {
	It("lets a fleet's ServiceAccount create and update only its own pod's labelled report Lease, and leaves every other account alone", func() {
		ns := newNamespace("leasepolicy")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &rbacv1.RoleBinding{})
		}).Should(Succeed())
		const pod = "fleet-proxy-6f7c9d8b4-x2x4q"
		mine := map[string]string{twv1alpha1.ReplicaConfigMapLabel: "fleet-proxy"}
		proxy := asServiceAccount(ns, "fleet-proxy", pod)
		noPod := asServiceAccount(ns, "fleet-proxy", "")

		// The policy takes effect shortly after it is created, and the proxy's Role when
		// the authorizer sees it: wait for the policy's own refusal.
		Eventually(func() error {
			return noPod.Create(ctx, reportLease(ns, "fleet-proxy-"+pod, mine))
		}).Should(refusedByPolicy("the ServiceAccount fleet-proxy of TokenProxy fleet writes its report Lease only with a token bound to its pod"),
			"a token without the pod-name claim (a legacy Secret token, a TokenRequest for no pod) creates no Lease, not even the right one")

		Expect(proxy.Create(ctx, reportLease(ns, "fleet-proxy-squat", mine))).To(
			refusedByPolicy("may write only the report Lease of its own pod, fleet-proxy-"+pod+", not fleet-proxy-squat"),
			"another name, even with the fleet's label")
		Expect(proxy.Create(ctx, reportLease(ns, "fleet-proxy-"+pod, nil))).To(
			refusedByPolicy("may write only its report Lease, labelled tokenwarden.io/configmap=fleet-proxy"),
			"its own name without the label the operator reads")
		Expect(proxy.Create(ctx, reportLease(ns, "fleet-proxy-"+pod,
			map[string]string{twv1alpha1.ReplicaConfigMapLabel: "other-proxy"}))).To(
			refusedByPolicy("labelled tokenwarden.io/configmap=fleet-proxy"), "its own name with another fleet's label")

		own := reportLease(ns, "fleet-proxy-"+pod, mine)
		Expect(proxy.Create(ctx, own)).To(Succeed(), "its own pod's report Lease")
		Expect(own.Labels).To(Equal(mine))

		By("updates: a replica renews its own Lease, and cannot relabel it or touch a sibling's")
		patch := func(c client.Client, name, body string) error {
			return c.Patch(ctx, reportLease(ns, name, nil), client.RawPatch(types.MergePatchType, []byte(body)))
		}
		// The Role names the Lease once the operator has seen it.
		Eventually(func() error {
			return patch(proxy, own.Name, `{"spec":{"renewTime":"2026-11-30T06:00:05.000000Z"}}`)
		}).Should(Succeed(), "a renewal")
		Expect(patch(proxy, own.Name, `{"metadata":{"labels":{"tokenwarden.io/configmap":"other-proxy"}}}`)).To(
			refusedByPolicy("labelled tokenwarden.io/configmap=fleet-proxy"), "posing as another fleet's replica")
		const sibling = "fleet-proxy-6f7c9d8b4-b7b7b"
		Expect(asServiceAccount(ns, "fleet-proxy", sibling).Create(ctx, reportLease(ns, "fleet-proxy-"+sibling, mine))).To(Succeed())
		Eventually(func() error {
			return patch(proxy, "fleet-proxy-"+sibling, `{"spec":{"holderIdentity":"`+pod+`"}}`)
		}).Should(refusedByPolicy("may write only the report Lease of its own pod, fleet-proxy-"+pod+", not fleet-proxy-"+sibling),
			"a sibling's Lease, which the Role names too")
		Expect(patch(noPod, own.Name, `{"spec":{"holderIdentity":"x"}}`)).To(refusedByPolicy("only with a token bound to its pod"))

		By("a second fleet in the namespace: neither may create the other's report Lease")
		other := fleetProxy(ns, 1)
		other.Name = "other"
		Expect(k8sClient.Create(ctx, other)).To(Succeed())
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "other-proxy"}, &rbacv1.RoleBinding{})
		}).Should(Succeed())
		const otherPod = "other-proxy-5c4b7f9d6-qq2rt"
		theirs := map[string]string{twv1alpha1.ReplicaConfigMapLabel: "other-proxy"}
		Eventually(func() error {
			return proxy.Create(ctx, reportLease(ns, "other-proxy-"+otherPod, theirs))
		}).Should(refusedByPolicy("the ServiceAccount fleet-proxy of TokenProxy fleet may write only its report Lease"),
			"the fleet's account, though the other fleet's TokenProxy is a parameter too")
		Expect(proxy.Create(ctx, reportLease(ns, "other-proxy-"+pod, theirs))).To(
			refusedByPolicy("the ServiceAccount fleet-proxy of TokenProxy fleet may write only its report Lease"), "with its own pod's name")
		Expect(asServiceAccount(ns, "other-proxy", otherPod).Create(ctx, reportLease(ns, "other-proxy-"+otherPod, theirs))).To(Succeed())

		By("every other account: the policy leaves it alone")
		// Allowed everything by RBAC: only the policy could refuse.
		for _, sa := range []string{"app-proxy", "controller"} {
			for i, pod := range []string{"", sa + "-0"} {
				Expect(asServiceAccount(ns, sa, pod, "system:masters").Create(ctx, reportLease(ns, fmt.Sprintf("%s-leader-%d", sa, i), nil))).To(Succeed(),
					"ServiceAccount %s with pod %q, not a fleet's", sa, pod)
			}
		}
		Expect(asServiceAccount("elsewhere", "fleet-proxy", pod, "system:masters").Create(ctx, reportLease(ns, "any-name", nil))).To(Succeed(),
			"a ServiceAccount of another namespace that happens to bear a fleet's name")
		Expect(k8sClient.Create(ctx, reportLease(ns, "fleet-proxy-by-hand", nil))).To(Succeed(), "an administrator")
	})
})
