// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package fakellm_test

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

var _ = Describe("The fake backend's failure modes", func() {
	post := func(url, body string) *http.Response {
		GinkgoHelper()
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		Expect(err).NotTo(HaveOccurred())
		return resp
	}

	It("answers a status sequence in order, then as Status says, with the headers set", func() {
		llm := fakellm.New()
		llm.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1, Statuses: []int{503, 429, 0},
			Header: map[string]string{"Retry-After": "3"}})
		srv := httptest.NewServer(llm)
		DeferCleanup(srv.Close)
		var codes []int
		for range 4 {
			resp := post(srv.URL, `{"model":"m"}`)
			codes = append(codes, resp.StatusCode)
			Expect(resp.Header.Get("Retry-After")).To(Equal("3"))
			resp.Body.Close()
		}
		Expect(codes).To(Equal([]int{503, 429, 200, 200}))
	})

	It("sends a slow-starting stream's headers at once and its first event after the delay", func() {
		llm := fakellm.New()
		llm.Set(fakellm.Behaviour{InputTokens: 1, OutputTokens: 1, StartDelay: 300 * time.Millisecond})
		srv := httptest.NewServer(llm)
		DeferCleanup(srv.Close)
		began := time.Now()
		resp := post(srv.URL, `{"model":"m","stream":true}`)
		defer resp.Body.Close()
		headers := time.Since(began)
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		Expect(err).NotTo(HaveOccurred())
		Expect(line).To(HavePrefix("data: "))
		Expect(time.Since(began)).To(BeNumerically(">=", 300*time.Millisecond))
		Expect(headers).To(BeNumerically("<", 300*time.Millisecond))
	})
})
