// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/test/bulk"
	"github.com/tokenwarden/tokenwarden/test/stack"
)

// effectiveKeys is the part of /admin/effective this spec reads.
type effectiveKeys struct {
	Generation int64             `json:"generation"`
	Digest     string            `json:"digest"`
	APIKeys    []json.RawMessage `json:"api_keys"`
}

func readEffective(p *stack.Proxy) (effectiveKeys, error) {
	var e effectiveKeys
	req, err := http.NewRequest(http.MethodGet, p.AdminURL+"/admin/effective", nil)
	if err != nil {
		return e, err
	}
	req.Header.Set("Authorization", "Bearer "+st.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return e, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return e, fmt.Errorf("GET /admin/effective: %s", resp.Status)
	}
	return e, json.NewDecoder(resp.Body).Decode(&e)
}

var _ = Describe("A fleet whose config passes 1 MiB", func() {
	It("reaches every proxy, running as the fleet's ServiceAccount, as chunks and a manifest, whole", func() {
		const keys = 1500
		ctx := context.Background()
		ns := namespace()

		start := time.Now()
		Expect(bulk.CreateKeys(ctx, st.Client, ns, "fleet", keys)).To(Succeed())
		created := time.Since(start)
		apply(ns, fmt.Sprintf(`
apiVersion: tokenwarden.io/v1alpha1
kind: TokenProxy
metadata: {name: fleet}
spec:
  replicas: 2
  upstreams: [{name: fake, url: %q}]
`, st.LLMURL))

		// The manifest and its chunks; the proxies start on it.
		var m *config.Manifest
		Eventually(func(g Gomega) {
			var cm corev1.ConfigMap
			g.Expect(st.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-proxy"}, &cm)).To(Succeed())
			var err error
			m, err = config.ParseManifest([]byte(cm.Data[config.ManifestKey]))
			g.Expect(err).NotTo(HaveOccurred())
		}, 2*time.Minute).Should(Succeed())
		Expect(m.Size).To(BeNumerically(">", 1<<20))
		rendered := time.Since(start)
		Expect(st.AsServiceAccount(ctx, ns, "fleet")).To(Succeed())
		proxies, err := st.SyncProxies(ctx, ns, "fleet")
		Expect(err).NotTo(HaveOccurred())
		g1 := enforced(ns)
		for _, p := range proxies {
			e, err := readEffective(p)
			Expect(err).NotTo(HaveOccurred())
			Expect(e.Generation).To(Equal(g1))
			Expect(e.Digest).To(Equal(m.Digest))
			Expect(e.APIKeys).To(HaveLen(keys))
		}
		// The replicas report the whole document's digest: the operator counts them.
		Eventually(func(g Gomega) {
			out, err := st.Kubectl("get", "tp/fleet", "-n", ns, "-o", `jsonpath={.status.enforced}`)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(out).To(Equal("2/2"))
		}).Should(Succeed())
		// Each reports in its own pod's Lease, the only Lease its pod-bound token may
		// create (the stack installs config/admission).
		var leases coordinationv1.LeaseList
		Expect(st.Client.List(ctx, &leases, client.InNamespace(ns), client.MatchingLabels{"tokenwarden.io/configmap": "fleet-proxy"})).To(Succeed())
		Expect(leases.Items).To(ConsistOf(HaveField("Name", "fleet-proxy-fleet-proxy-0"), HaveField("Name", "fleet-proxy-fleet-proxy-1")))
		loaded := time.Since(start)

		// A key of the large config admits traffic.
		req, err := http.NewRequest(http.MethodPost, proxies[0].URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":16}`))
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Authorization", "Bearer "+bulk.SecretValue(1234))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		_ = resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusOK))

		// An edit of one key: a new chunk, a new manifest, applied by both proxies.
		edit := time.Now()
		_, err = st.Kubectl("patch", "apikey/"+bulk.KeyName(keys-1), "-n", ns, "--type=merge", "-p", `{"spec":{"team":"blue"}}`)
		Expect(err).NotTo(HaveOccurred())
		g2 := enforced(ns)
		Expect(g2).To(Equal(g1 + 1))
		for _, p := range proxies {
			e, err := readEffective(p)
			Expect(err).NotTo(HaveOccurred())
			Expect(e.Generation).To(Equal(g2))
			Expect(e.APIKeys).To(HaveLen(keys))
		}
		AddReportEntry("A fleet of 1,500 keys over 1 MiB", fmt.Sprintf(
			"%d bytes in %d chunks; keys created in %v, manifest written %v after, both proxies (as the fleet's ServiceAccount) enforcing %v after; one key's edit enforced by both in %v",
			m.Size, len(m.Chunks), created.Round(time.Millisecond), (rendered-created).Round(time.Millisecond),
			(loaded-rendered).Round(time.Millisecond), time.Since(edit).Round(time.Millisecond)))
	})
})
