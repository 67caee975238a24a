// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server_test

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
)

var _ = Describe("The class's output cap with the model registry", func() {
	It("reaches an upstream that takes the request under its provider's model name, after a failover", func() {
		r := newRegistry("scheduling:\n  classes:\n    interactive: {max_output_tokens: 50}\n")
		r.primary.Set(fakellm.Behaviour{Status: 503})
		r.secondary.Set(fakellmUsage(10, 20))
		rep := r.do("POST", "/v1/chat/completions", "sk-alice", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":200}`)
		Expect(rep.code).To(Equal(200), string(rep.body))
		Expect(rep.header.Get(server.UpstreamHeader)).To(Equal("secondary"))
		for i, up := range []*fakellm.Server{r.primary, r.secondary} {
			reqs := up.Requests()
			Expect(reqs).To(HaveLen(1))
			var m map[string]any
			Expect(json.Unmarshal(reqs[0].Body, &m)).To(Succeed())
			Expect(m["max_tokens"]).To(Equal(50.0), "attempt %d is capped", i+1)
		}
		var m map[string]any
		Expect(json.Unmarshal(r.secondary.Requests()[0].Body, &m)).To(Succeed())
		Expect(m["model"]).To(Equal("gpt-4o-2024-08-06"))
	})
})
