// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"context"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// refusedReads is the suite's reconciler's client: the manager's, except that it
// reads the Deployments of the namespaces a spec names from the API server as a user
// without rights, which refuses them, as it would refuse an operator whose
// ClusterRole lost a verb; and that it holds the ConfigMap writes of the namespaces
// a spec names until it releases them, as a slow admission webhook or a slow render
// would hold the reconcile.
type refusedReads struct {
	client.Client
	refuser client.Client

	mu         sync.Mutex
	namespaces map[string]bool
	held       map[string]*heldCreates
}

// heldCreates holds one namespace's ConfigMap writes: started is closed by the first
// write held, release lets them all through.
type heldCreates struct {
	started, release chan struct{}
	once             sync.Once
}

// holdConfigMaps holds ns's ConfigMap creates and updates until the returned release
// is called; the channel is closed once a write is held.
func (r *refusedReads) holdConfigMaps(ns string) (started <-chan struct{}, release func()) {
	h := &heldCreates{started: make(chan struct{}), release: make(chan struct{})}
	r.mu.Lock()
	r.held[ns] = h
	r.mu.Unlock()
	var once sync.Once
	return h.started, func() {
		once.Do(func() {
			r.mu.Lock()
			delete(r.held, ns)
			r.mu.Unlock()
			close(h.release)
		})
	}
}

// Create waits, for a ConfigMap of a namespace whose writes are held, until they
// are released.
func (r *refusedReads) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := r.waitHeld(ctx, obj); err != nil {
		return err
	}
	return r.Client.Create(ctx, obj, opts...)
}

// Update waits as Create does.
func (r *refusedReads) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := r.waitHeld(ctx, obj); err != nil {
		return err
	}
	return r.Client.Update(ctx, obj, opts...)
}

// waitHeld returns once obj's write may go on: at once unless obj is a ConfigMap of a
// namespace whose writes are held.
func (r *refusedReads) waitHeld(ctx context.Context, obj client.Object) error {
	r.mu.Lock()
	h := r.held[obj.GetNamespace()]
	r.mu.Unlock()
	if _, ok := obj.(*corev1.ConfigMap); !ok || h == nil {
		return nil
	}
	h.once.Do(func() { close(h.started) })
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readsOf is the client the suite's reconciler reads through.
var readsOf *refusedReads

// newRefusedReads wraps c; the user operator-without-rights exists in no binding.
func newRefusedReads(c client.Client) *refusedReads {
	GinkgoHelper()
	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "operator-without-rights"}
	refuser, err := client.New(as, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return &refusedReads{Client: c, refuser: refuser, namespaces: map[string]bool{}, held: map[string]*heldCreates{}}
}

// refuse makes the reads of ns's Deployments fail (on) or work again (off).
func (r *refusedReads) refuse(ns string, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.namespaces[ns] = on
}

// Get reads through the refusing user when obj is a Deployment of a refused namespace.
func (r *refusedReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	r.mu.Lock()
	refused := r.namespaces[key.Namespace]
	r.mu.Unlock()
	if _, ok := obj.(*appsv1.Deployment); ok && refused {
		return r.refuser.Get(ctx, key, obj, opts...)
	}
	return r.Client.Get(ctx, key, obj, opts...)
}

var _ = Describe("The fleet reconciler, when what the fleet is made of cannot be read", func() {
	It("says Degraded=ReadFailed with the API server's refusal, changes nothing, and clears it once reads work again", func() {
		ns := newNamespace("readfailed")
		tp := fleetProxy(ns, 1)
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(deployment(g, ns).Spec.Replicas).To(HaveValue(Equal(int32(1))))
			g.Expect(condition(proxyStatus(g, ns).Conditions, "Degraded").Reason).To(Equal("Reconciled"))
		}).Should(Succeed())

		By("the API server refusing the operator's read of the fleet's Deployment, then a scale")
		readsOf.refuse(ns, true)
		DeferCleanup(readsOf.refuse, ns, false)
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tp), tp)).To(Succeed())
		patch := client.MergeFrom(tp.DeepCopy())
		tp.Spec.Replicas = ptr.To(int32(2))
		Expect(k8sClient.Patch(ctx, tp, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			deg := condition(proxyStatus(g, ns).Conditions, "Degraded")
			g.Expect(deg.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(deg.Reason).To(Equal("ReadFailed"))
			g.Expect(deg.ObservedGeneration).To(Equal(tp.Generation), "of the spec it could not act on")
			// What failed, who was refused which verb, and what happens meanwhile.
			g.Expect(deg.Message).To(HavePrefix(`Read: get Deployment: deployments.apps "fleet-proxy" is forbidden: ` +
				`User "operator-without-rights" cannot get resource "deployments" in API group "apps" in the namespace "` + ns + `"`))
			g.Expect(deg.Message).To(HaveSuffix("the operator renders and changes nothing of the fleet until it can read what the fleet is made of, and retries"))
			g.Expect(warningReasons(g, ns)).To(ContainElement("ReadFailed"))
		}).Should(Succeed())
		Expect(deployment(Default, ns).Spec.Replicas).To(HaveValue(Equal(int32(1))), "nothing is applied from what could not be read")

		By("reads working again")
		readsOf.refuse(ns, false)
		Eventually(func(g Gomega) {
			deg := condition(proxyStatus(g, ns).Conditions, "Degraded")
			g.Expect(deg.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(deg.Reason).To(Equal("Reconciled"))
			g.Expect(deployment(g, ns).Spec.Replicas).To(HaveValue(Equal(int32(2))), "the scale is applied by the retry")
		}).Should(Succeed())
	})
})
