// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package adminauth_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The suite runs the real kube-apiserver and etcd that hack/tools.sh builds into bin/
// (KUBEBUILDER_ASSETS, set by the Makefile; the repository's bin/ otherwise): the
// reviews are the API server's own answers.
var (
	testEnv *envtest.Environment
	admin   kubernetes.Interface // the control plane's administrator
	proxy   kubernetes.Interface // what the Reviewer uses: counts its requests
	calls   atomic.Int64         // review requests sent through proxy
)

func TestAdminAuth(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Admin auth Suite")
}

var _ = BeforeSuite(func() {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		bin, err := filepath.Abs(filepath.Join("..", "..", "bin"))
		Expect(err).NotTo(HaveOccurred())
		_, err = os.Stat(filepath.Join(bin, "kube-apiserver"))
		Expect(err).NotTo(HaveOccurred(), "no kube-apiserver in bin/: run hack/tools.sh etcd kube-apiserver, or the suite through make test")
		GinkgoT().Setenv("KUBEBUILDER_ASSETS", bin)
	}
	testEnv = &envtest.Environment{}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(testEnv.Stop()).To(Succeed()) })

	admin, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	counted := rest.CopyConfig(cfg)
	counted.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if strings.HasSuffix(req.URL.Path, "/tokenreviews") || strings.HasSuffix(req.URL.Path, "/subjectaccessreviews") {
				calls.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	proxy, err = kubernetes.NewForConfig(counted)
	Expect(err).NotTo(HaveOccurred())
	SetDefaultEventuallyTimeout(10 * time.Second)
})

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// weakClient reaches the API server with a bearer token instead of the
// administrator's certificate.
func weakClient(token string) kubernetes.Interface {
	GinkgoHelper()
	c := rest.AnonymousClientConfig(testEnv.Config)
	c.BearerToken = token
	cs, err := kubernetes.NewForConfig(c)
	Expect(err).NotTo(HaveOccurred())
	return cs
}
