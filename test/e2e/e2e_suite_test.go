// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package e2e drives the whole system (a real control plane, the operator, proxy
// processes watching their ConfigMaps) with the clients users run: the official
// OpenAI and Anthropic Go and Node SDKs and kubectl.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/stack"
)

var (
	st   *stack.Stack
	root string
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "End-to-end Suite")
}

var _ = BeforeSuite(func() {
	var err error
	root, err = filepath.Abs(filepath.Join("..", ".."))
	Expect(err).NotTo(HaveOccurred())
	// The proxy binary under test, built from this tree.
	proxy := filepath.Join(GinkgoT().TempDir(), "proxy")
	build := exec.Command("go", "build", "-o", proxy, "./proxy/cmd/proxy")
	build.Dir = root
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s", out)

	st, err = stack.Start(context.Background(), stack.Options{Root: root, LLMAddr: "127.0.0.1:0", ProxyBinary: proxy, Log: GinkgoWriter,
		UsageInterval: usageInterval})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(st.Stop)
	// Deadlines are generous: a loaded machine is slow, not wrong. What the suite
	// measures it reports as figures (AddReportEntry), not as bounds.
	SetDefaultEventuallyTimeout(enforceTimeout)
	SetDefaultEventuallyPollingInterval(50 * time.Millisecond)
})

// enforceTimeout bounds each wait for the fleet to hold what a spec applied.
const enforceTimeout = time.Minute

var namespaces int

// namespace creates a fresh namespace for one spec.
func namespace() string {
	GinkgoHelper()
	namespaces++
	ns := fmt.Sprintf("e2e-%d-%d", os.Getpid()%1000, namespaces)
	_, err := st.Kubectl("create", "namespace", ns)
	Expect(err).NotTo(HaveOccurred())
	return ns
}

// apply pipes a manifest into kubectl apply.
func apply(ns, manifest string) {
	GinkgoHelper()
	path := filepath.Join(GinkgoT().TempDir(), "manifest.yaml")
	Expect(os.WriteFile(path, []byte(manifest), 0o600)).To(Succeed())
	_, err := st.Kubectl("apply", "-n", ns, "-f", path)
	Expect(err).NotTo(HaveOccurred())
}

// fleetManifest is a TokenProxy in front of the stack's fake backend, with two keys.
func fleetManifest(replicas int, storage string) string {
	return fmt.Sprintf(`
apiVersion: tokenwarden.io/v1alpha1
kind: TokenProxy
metadata: {name: fleet}
spec:
  replicas: %d
  upstreams: [{name: fake, url: %q}]
  storage: %s
`, replicas, st.LLMURL, storage) + keyManifest("alice", "") + keyManifest("bob", "")
}

// keyManifest is the ApiKey "name" of the fleet, user name and team e2e, with its
// labelled Secret holding sk-e2e-NAME; spec adds fields to the ApiKey's spec.
func keyManifest(name, spec string) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Secret
metadata: {name: %[1]s-key, labels: {tokenwarden.io/secret: api-key}}
stringData: {key: sk-e2e-%[1]s}
---
apiVersion: tokenwarden.io/v1alpha1
kind: ApiKey
metadata: {name: %[1]s}
spec: {proxyRef: {name: fleet}, secretRef: {name: %[1]s-key}, user: %[1]s, team: e2e%[2]s}
`, name, spec)
}

func budgetManifest(name, dimension string, tpm int) string {
	return fmt.Sprintf(`
apiVersion: tokenwarden.io/v1alpha1
kind: TokenBudget
metadata: {name: %s}
spec: {proxyRef: {name: fleet}, dimension: %s, tokensPerMinute: %d}
`, name, dimension, tpm)
}

// fleet applies a fleet with its budgets, starts its proxies and returns them once
// every proxy enforces all of it: the keys, the budgets and the division.
func fleet(ns string, replicas int, storage string, budgets ...string) []*stack.Proxy {
	GinkgoHelper()
	apply(ns, fleetManifest(replicas, storage))
	for _, b := range budgets {
		apply(ns, b)
	}
	proxies, err := st.SyncProxies(context.Background(), ns, "fleet")
	Expect(err).NotTo(HaveOccurred())
	enforced(ns)
	Expect(stack.CheckDivisor(context.Background(), proxies, int64(replicas))).To(Succeed())
	return proxies
}

// enforced waits until every proxy of the namespace's fleet has applied the config
// that holds what the spec applied, and returns that config's generation.
func enforced(ns string) int64 {
	GinkgoHelper()
	g, err := st.WaitEnforced(context.Background(), ns, "fleet", enforceTimeout)
	Expect(err).NotTo(HaveOccurred())
	return g
}
