// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"io"
	"net/http"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("The proxy's admin API", func() {
	It("serves /admin/effective whole only to a token that kubectl create token made for a reader, and keeps the probes and metrics open", func() {
		ns := namespace()
		proxies := fleet(ns, 1, "{type: Memory}")
		admin := proxies[0].AdminURL

		get := func(path, token string) (int, string) {
			GinkgoHelper()
			req, err := http.NewRequest(http.MethodGet, admin+path, nil)
			Expect(err).NotTo(HaveOccurred())
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			defer func() { _ = resp.Body.Close() }()
			b, err := io.ReadAll(resp.Body)
			Expect(err).NotTo(HaveOccurred())
			return resp.StatusCode, string(b)
		}
		token := func(sa string) string {
			GinkgoHelper()
			_, err := st.Kubectl("create", "serviceaccount", sa, "-n", ns)
			Expect(err).NotTo(HaveOccurred())
			out, err := st.Kubectl("create", "token", sa, "-n", ns, "--duration=10m")
			Expect(err).NotTo(HaveOccurred())
			return strings.TrimSpace(out)
		}

		code, body := get("/admin/effective", "")
		Expect(code).To(Equal(http.StatusUnauthorized))
		Expect(body).To(ContainSubstring(`"type":"unauthenticated"`))

		// A caller with no binding is refused the fleet's paths, and served only the
		// tenants it may read of a tenant path: none, so no key and no upstream.
		stranger := token("stranger")
		code, body = get("/admin/durable", stranger)
		Expect(code).To(Equal(http.StatusForbidden))
		Expect(body).To(ContainSubstring(`may not get /admin/durable`))
		code, body = get("/admin/effective", stranger)
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).NotTo(ContainSubstring(`"name": "alice"`))
		Expect(body).To(ContainSubstring(`"upstreams": []`))

		reader := token("reader")
		_, err := st.Kubectl("create", "clusterrolebinding", ns+"-reader",
			"--clusterrole=tokenwarden-proxy-admin-reader", "--serviceaccount="+ns+":reader")
		Expect(err).NotTo(HaveOccurred())
		code, body = get("/admin/effective", reader)
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).To(ContainSubstring(`"name": "alice"`))

		for _, open := range []string{"/healthz", "/readyz", "/metrics"} {
			code, _ = get(open, "")
			Expect(code).To(Equal(http.StatusOK), open)
		}
		_, body = get("/metrics", "")
		Expect(body).To(ContainSubstring(`tokenwarden_admin_auth_requests_total{cached="false",result="allowed"}`))
	})
})
