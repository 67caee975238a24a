// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	"slices"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("Parse of a JSON document (the form the operator renders a large fleet's document in)", func() {
	It("means what the same document in YAML means", func() {
		c, err := config.Parse(largeDocument(300))
		Expect(err).NotTo(HaveOccurred())
		c.RateLimiting.Limits.PerModel = map[string]config.DimensionLimits{"gpt-4o": {TokensPerMinute: 10}}
		c.Upstreams[0].Models = []string{"a<b>&c"}
		doc, err := c.Render()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(doc)).To(HavePrefix("{"))
		Expect(string(doc)).To(ContainSubstring(`"a<b>&c"`), "no HTML escaping: the document is read by people too")

		fromJSON, err := config.Parse(doc)
		Expect(err).NotTo(HaveOccurred())
		Expect(fromJSON).To(Equal(c))
		yamlDoc, err := c.Marshal()
		Expect(err).NotTo(HaveOccurred())
		fromYAML, err := config.Parse(yamlDoc)
		Expect(err).NotTo(HaveOccurred())
		Expect(fromJSON).To(Equal(fromYAML))
	})

	DescribeTable("refuses a bad document with the error the YAML form gets",
		func(doc string) {
			js, err := yaml.YAMLToJSON([]byte(doc))
			Expect(err).NotTo(HaveOccurred())
			_, yamlErr := config.Parse([]byte(doc))
			Expect(yamlErr).To(HaveOccurred())
			_, jsonErr := config.Parse(js)
			Expect(jsonErr).To(HaveOccurred())
			Expect(jsonErr.Error()).To(Equal(yamlErr.Error()))
		},
		Entry("a typo in a limit", minimal+"rate_limiting: {limits: {global: {tokens_per_minit: 5}}}"),
		Entry("a typo inside a per_model entry", minimal+"rate_limiting: {limits: {per_model: {m: {tpm: 5}}}}"),
		Entry("two typos", minimal+"api_keys: [{name: a, key_sha256: "+hash+", usr: x}]\nlistn: x"),
		Entry("two keys with one hash", minimal+"api_keys: [{name: a, key_sha256: "+hash+"}, {name: b, key_sha256: "+strings.ToUpper(hash)+"}]"),
		Entry("a bad key name", minimal+"api_keys: [{name: -a, key_sha256: "+hash+"}]"),
		Entry("no upstream", "listen: 127.0.0.1:1"),
	)

	DescribeTable("refuses a key given twice in one object, as YAML does, naming it",
		func(js, key string) {
			_, err := config.Parse([]byte(js))
			Expect(err).To(MatchError(ContainSubstring(`key "` + key + `" appears twice`)))
		},
		Entry("at the top", `{"listen":"127.0.0.1:1","upstreams":[{"name":"d","url":"http://x"}],"listen":"127.0.0.1:2"}`, "listen"),
		Entry("in a key", `{"upstreams":[{"name":"d","url":"http://x"}],"api_keys":[{"name":"a","key_sha256":"`+hash+`","user":"u","user":"v"}]}`, "user"),
		Entry("spelt with an escape", `{"upstreams":[{"name":"d","url":"http://x"}],"api_keys":[{"name":"a","key_sha256":"`+hash+`","us\u0065r":"u","user":"v"}]}`, "user"),
		Entry("in a large map", `{"upstreams":[{"name":"d","url":"http://x"}],"rate_limiting":{"limits":{"per_model":{`+
			manyModels(40)+`,"m7":{}}}}}`, "m7"),
	)

	It("names a field of the wrong type", func() {
		_, err := config.Parse([]byte(`{"upstreams":[{"name":"d","url":"http://x"}],"max_body_bytes":"lots"}`))
		Expect(err).To(MatchError(ContainSubstring("max_body_bytes of type int64")))
	})

	It("accepts the same key in different objects", func() {
		_, err := config.Parse([]byte(`{"upstreams":[{"name":"d","url":"http://x"},{"name":"e","url":"http://y"}],"rate_limiting":{"limits":{"per_model":{` + manyModels(40) + `}}}}`))
		Expect(err).NotTo(HaveOccurred())
	})

	It("refuses anything after the document", func() {
		_, err := config.Parse([]byte(`{"upstreams":[{"name":"d","url":"http://x"}]} {"listen":"x"}`))
		Expect(err).To(MatchError(ContainSubstring("more than one JSON value")))
	})

	It("refuses a YAML document where duplicate keys are", func() {
		_, err := config.Parse([]byte(minimal + "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n"))
		Expect(err).To(MatchError(ContainSubstring(`"listen" already set`)))
	})
})

// manyModels is n per_model entries m0 to m<n-1>, as JSON object members.
func manyModels(n int) string {
	parts := make([]string, n)
	for i := range n {
		parts[i] = `"m` + strconv.Itoa(i) + `":{"tokens_per_minute":1}`
	}
	return strings.Join(parts, ",")
}

var _ = Describe("Render", func() {
	It("puts one key to a line, first, and the generation last, so a changed key leaves the chunks before it as they were", func() {
		c, err := config.Parse(largeDocument(20000))
		Expect(err).NotTo(HaveOccurred())
		c.Generation = 7
		doc, err := c.Render()
		Expect(err).NotTo(HaveOccurred())
		lines := strings.Split(strings.TrimSuffix(string(doc), "\n"), "\n")
		Expect(lines[0]).To(Equal(`{"api_keys":[`))
		Expect(lines[1]).To(HavePrefix(`{"name":"key-0",`))
		Expect(lines[len(lines)-1]).To(HaveSuffix(`"generation":7}`))
		before, _ := config.Split(doc, 7, "p", config.MaxInline)
		Expect(len(before)).To(BeNumerically(">=", 3))

		c.Generation = 8
		c.APIKeys[len(c.APIKeys)-1].Team = "blue"
		doc2, err := c.Render()
		Expect(err).NotTo(HaveOccurred())
		after, _ := config.Split(doc2, 8, "p", config.MaxInline)
		Expect(after).To(HaveLen(len(before)))
		for i := range len(before) - 1 {
			Expect(after[i].Name).To(Equal(before[i].Name))
		}
		Expect(after[len(after)-1].Name).NotTo(Equal(before[len(before)-1].Name))
	})

	It("renders a document at any generation from its rendering at generation 0 (WithGeneration)", func() {
		c, err := config.Parse(largeDocument(100))
		Expect(err).NotTo(HaveOccurred())
		c.Generation = 0
		doc0, err := c.Render()
		Expect(err).NotTo(HaveOccurred())
		Expect(config.WithGeneration(doc0, 0)).To(Equal(doc0))
		for _, g := range []int64{1, 8, 123456} {
			c.Generation = g
			want, err := c.Render()
			Expect(err).NotTo(HaveOccurred())
			Expect(string(config.WithGeneration(doc0, g))).To(Equal(string(want)))
		}
	})

	It("renders a document without keys or generation", func() {
		c, err := config.Parse([]byte(minimal))
		Expect(err).NotTo(HaveOccurred())
		doc, err := c.Render()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(doc)).To(HavePrefix(`{"listen":`))
		again, err := config.Parse(doc)
		Expect(err).NotTo(HaveOccurred())
		Expect(again).To(Equal(c))
	})
})

var _ = Describe("ParseKeys", func() {
	It("means what Parse of the whole document means, and refuses what it refuses, naming the key's field", func() {
		whole, err := config.Parse(largeDocument(200))
		Expect(err).NotTo(HaveOccurred())
		shell := *whole
		shell.APIKeys = nil
		doc, err := shell.Render()
		Expect(err).NotTo(HaveOccurred())
		got, err := config.ParseKeys(doc, slices.Clone(whole.APIKeys))
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(whole))

		keys := slices.Clone(whole.APIKeys)
		keys[150].KeySHA256 = keys[3].KeySHA256
		_, err = config.ParseKeys(doc, keys)
		Expect(err).To(MatchError(ContainSubstring("api_keys[150].key_sha256: the same key as api_keys[3]")))
	})
})
