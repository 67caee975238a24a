// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers"
)

var _ = Describe("The proxy's RBAC", func() {
	It("lets a fleet's ServiceAccount review its admin callers through system:auth-delegator, and goes with the fleet", func() {
		ns := newNamespace("adminauth")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		name := "tokenwarden-proxy:" + ns + ":fleet"
		var crb rbacv1.ClusterRoleBinding
		Eventually(func() error { return k8sClient.Get(ctx, client.ObjectKey{Name: name}, &crb) }).Should(Succeed())
		Expect(crb.RoleRef).To(Equal(rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"}))
		Expect(crb.Subjects).To(Equal([]rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "fleet-proxy"}}))
		Expect(crb.Labels).To(HaveKeyWithValue("app.kubernetes.io/instance", "fleet"))
		Expect(crb.Labels).To(HaveKeyWithValue("tokenwarden.io/fleet-namespace", ns))

		Expect(k8sClient.Delete(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Name: name}, &rbacv1.ClusterRoleBinding{}))
		}).Should(BeTrue(), "a cluster-scoped binding has no owner to take it: the operator deletes it")
	})

	It("grants the proxy only what the operator's own ClusterRole (config/rbac) may grant", func() {
		// The operator as a user holding exactly the generated ClusterRole.
		data, err := os.ReadFile(filepath.Join("..", "config", "rbac", "role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		var role rbacv1.ClusterRole
		Expect(yaml.UnmarshalStrict(data, &role)).To(Succeed())
		role.Name = "rbac-test-operator"
		Expect(k8sClient.Create(ctx, &role)).To(Succeed())
		Expect(k8sClient.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "rbac-test-operator"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "rbac-test-operator"}},
		})).To(Succeed())
		user, err := testEnv.AddUser(envtest.User{Name: "rbac-test-operator"}, cfg)
		Expect(err).NotTo(HaveOccurred())
		operator, err := client.New(user.Config(), client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())

		ns := newNamespace("grants")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		var proxyRole rbacv1.Role
		var crb rbacv1.ClusterRoleBinding
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &proxyRole)).To(Succeed())
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "tokenwarden-proxy:" + ns + ":fleet"}, &crb)).To(Succeed())
		}).Should(Succeed())

		// What the operator rendered, created again (dry run) by the operator's identity:
		// RBAC refuses to grant what the creator does not hold.
		dry := client.DryRunAll
		Expect(operator.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "again"}, Rules: proxyRole.Rules,
		}, dry)).To(Succeed(), "the proxy's Role")
		Expect(operator.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "again"}, RoleRef: crb.RoleRef, Subjects: crb.Subjects,
		}, dry)).To(Succeed(), "the proxy's binding to system:auth-delegator")
	})

	It("lets a proxy renew and delete its own report Lease, and no other Lease of its namespace", func() {
		ns := newNamespace("leases")
		Expect(k8sClient.Create(ctx, fleetProxy(ns, 1))).To(Succeed())
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &rbacv1.Role{})
		}).Should(Succeed())
		// The proxy as its pods run: the fleet's ServiceAccount, with a token bound to its pod.
		proxy := asServiceAccount(ns, "fleet-proxy", "r1")
		lease := func(name string, labels map[string]string) *coordinationv1.Lease {
			return reportLease(ns, name, labels)
		}
		renew := func(c client.Client, name string) error {
			return c.Patch(ctx, lease(name, nil), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"holderIdentity":"renewed"}}`)))
		}

		mine := lease("fleet-proxy-r1", map[string]string{twv1alpha1.ReplicaConfigMapLabel: "fleet-proxy"})
		Eventually(func() error { return proxy.Create(ctx, mine) }).Should(Succeed(), "a replica creates its report Lease (once its RoleBinding exists)")
		Eventually(func() error { return renew(proxy, mine.Name) }).Should(Succeed(), "and renews it once the operator names it in the Role")

		other := lease("some-controller-leader", nil)
		Expect(k8sClient.Create(ctx, other)).To(Succeed())
		Expect(apierrors.IsForbidden(renew(proxy, other.Name))).To(BeTrue(), "another Lease cannot be renewed")
		Expect(apierrors.IsForbidden(proxy.Delete(ctx, other))).To(BeTrue(), "nor deleted")
		Expect(apierrors.IsForbidden(proxy.Get(ctx, client.ObjectKeyFromObject(other), &coordinationv1.Lease{}))).To(BeTrue(), "nor read")
		// RBAC cannot limit create by name (the admission policy does: leasepolicy_test.go);
		// a Lease of the fleet's prefix that someone else made is still out of reach.
		squat := lease("fleet-proxy-squat", nil)
		Expect(k8sClient.Create(ctx, squat)).To(Succeed())
		Consistently(func() bool { return apierrors.IsForbidden(renew(proxy, squat.Name)) }, time.Second).Should(BeTrue(),
			"a Lease without the fleet's label is never named in the Role")

		Expect(proxy.Delete(ctx, mine)).To(Succeed(), "a replica that stops deletes its own")
	})
})

var _ = Describe("A fleet deleted while the operator is not running", func() {
	It("loses its system:auth-delegator binding when the operator starts again; a fleet that exists keeps its own", func() {
		// An API server of its own: the suite's manager must not see the deletion.
		env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
		envCfg, err := env.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(env.Stop)
		c, err := client.New(envCfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "orphans"}}
		Expect(c.Create(ctx, ns)).To(Succeed())
		gone, kept := fleetProxy(ns.Name, 1), fleetProxy(ns.Name, 1)
		kept.Name = "kept"
		binding := func(tp *twv1alpha1.TokenProxy) client.ObjectKey {
			return client.ObjectKey{Name: "tokenwarden-proxy:" + tp.Namespace + ":" + tp.Name}
		}

		stop := runOperator(envCfg)
		Expect(c.Create(ctx, gone)).To(Succeed())
		Expect(c.Create(ctx, kept)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(c.Get(ctx, binding(gone), &rbacv1.ClusterRoleBinding{})).To(Succeed())
			g.Expect(c.Get(ctx, binding(kept), &rbacv1.ClusterRoleBinding{})).To(Succeed())
		}).Should(Succeed())
		stop()

		Expect(c.Delete(ctx, gone)).To(Succeed())
		collectGarbage(c, gone)
		Expect(c.Get(ctx, binding(gone), &rbacv1.ClusterRoleBinding{})).To(Succeed(), "nothing ran to delete it")

		DeferCleanup(runOperator(envCfg))
		Eventually(func() bool {
			return apierrors.IsNotFound(c.Get(ctx, binding(gone), &rbacv1.ClusterRoleBinding{}))
		}).Should(BeTrue(), "the binding of a TokenProxy that is gone is deleted at start")
		Consistently(func() error { return c.Get(ctx, binding(kept), &rbacv1.ClusterRoleBinding{}) }, time.Second).Should(Succeed())
	})
})

// runOperator runs the operator's manager against the API server of cfg until the
// returned function stops it (and waits until it stopped).
func runOperator(cfg *rest.Config) (stop func()) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  controllers.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// The suite's manager runs controllers of the same names in this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	mctx, cancel := context.WithCancel(ctx)
	Expect((&controllers.TokenProxyReconciler{
		Client: mgr.GetClient(), Events: mgr.GetEventRecorder("tokenwarden"), ProxyImage: "tokenwarden:test",
	}).SetupWithManager(mctx, mgr)).To(Succeed())
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(mgr.Start(mctx)).To(Succeed())
	}()
	return func() {
		cancel()
		<-done
	}
}

// collectGarbage deletes what a cluster's garbage collector deletes with owner, which
// envtest does not run: the namespaced objects it owns.
func collectGarbage(c client.Client, owner client.Object) {
	GinkgoHelper()
	for _, list := range []client.ObjectList{&corev1.ConfigMapList{}, &corev1.ServiceList{}, &corev1.ServiceAccountList{},
		&appsv1.DeploymentList{}, &policyv1.PodDisruptionBudgetList{}, &networkingv1.NetworkPolicyList{},
		&rbacv1.RoleList{}, &rbacv1.RoleBindingList{}} {
		Expect(c.List(ctx, list, client.InNamespace(owner.GetNamespace()))).To(Succeed())
		objs, err := meta.ExtractList(list)
		Expect(err).NotTo(HaveOccurred())
		for _, o := range objs {
			obj := o.(client.Object)
			if slices.ContainsFunc(obj.GetOwnerReferences(), func(ref metav1.OwnerReference) bool { return ref.UID == owner.GetUID() }) {
				Expect(client.IgnoreNotFound(c.Delete(ctx, obj))).To(Succeed())
			}
		}
	}
}
