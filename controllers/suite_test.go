// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers"
)

// The suite runs the real kube-apiserver and etcd that `make tools` builds into bin/
// (KUBEBUILDER_ASSETS, set by `make test`), installs the CRDs from config/crd/bases,
// and runs the manager against them.
var (
	testEnv   *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client // uncached: reads what the API server stored
	mgrClient client.Client // the manager's cached client
	scheme    = runtime.NewScheme()
	ctx       context.Context
	cancel    context.CancelFunc
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controllers Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	ctx, cancel = context.WithCancel(context.Background())

	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set: run the suite through `make test`, which builds kube-apiserver and etcd into bin/")

	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(twv1alpha1.AddToScheme(scheme))

	testEnv = &envtest.Environment{
		// The ServiceMonitor CRD (testdata/crds) is installed after the manager started,
		// by the specs that need it: installServiceMonitorCRD.
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	var err error
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		cancel()
		Expect(testEnv.Stop()).To(Succeed())
	})

	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	// The cluster-wide admission policy config/default installs with the operator.
	installReportLeasePolicy()

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  controllers.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	Expect(err).NotTo(HaveOccurred())
	mgrClient = mgr.GetClient()
	readsOf = newRefusedReads(mgr.GetClient())
	Expect((&controllers.TokenProxyReconciler{
		Client:     readsOf,
		Events:     mgr.GetEventRecorder("tokenwarden"),
		ProxyImage: "tokenwarden:test",
		// Short, so that the usage specs wait for a few intervals, not minutes.
		UsageInterval: usageInterval,
	}).SetupWithManager(ctx, mgr)).To(Succeed())

	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	Expect(mgr.GetCache().WaitForCacheSync(ctx)).To(BeTrue())
	SetDefaultEventuallyTimeout(10 * time.Second)
	SetDefaultEventuallyPollingInterval(50 * time.Millisecond)
})

// installReportLeasePolicy creates the ValidatingAdmissionPolicy and its binding of
// config/admission, as they are shipped.
func installReportLeasePolicy() {
	GinkgoHelper()
	for _, f := range []struct {
		file string
		obj  client.Object
	}{
		{"report_lease_policy.yaml", &admissionregistrationv1.ValidatingAdmissionPolicy{}},
		{"report_lease_policy_binding.yaml", &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}},
	} {
		data, err := os.ReadFile(filepath.Join("..", "config", "admission", f.file))
		Expect(err).NotTo(HaveOccurred())
		Expect(yaml.UnmarshalStrict(data, f.obj)).To(Succeed(), f.file)
		Expect(k8sClient.Create(ctx, f.obj)).To(Succeed(), f.file)
	}
}

// installServiceMonitorCRD installs the Prometheus Operator's ServiceMonitor CRD, if it
// is not yet, and waits until the API server serves it. The manager started without
// it: the operator must pick it up.
func installServiceMonitorCRD() {
	GinkgoHelper()
	_, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{filepath.Join("testdata", "crds")}, ErrorIfPathMissing: true})
	Expect(err).NotTo(HaveOccurred())
}
