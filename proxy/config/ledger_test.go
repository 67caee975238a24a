// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("The ledger section", func() {
	It("spools 64 MiB, flushes every 10 s, keeps serving when full and keeps keys a week unless told otherwise", func() {
		c, err := config.Parse([]byte(minimal))
		Expect(err).NotTo(HaveOccurred())
		l := c.Ledger
		Expect(l.Spool()).To(Equal(int64(64 << 20)))
		Expect(l.FlushInterval()).To(Equal(10 * time.Second))
		Expect(l.FullPolicy()).To(Equal(config.LedgerKeepServing))
		Expect(l.KeyRetention()).To(Equal(7 * 24 * time.Hour))
		out, err := c.Marshal()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).NotTo(ContainSubstring("ledger"), "the defaults are read, not written")
	})

	It("reads a fleet's ledger: the URL from the environment, the spool and its policy", func() {
		c, err := config.Parse([]byte(minimal + `
ledger: {url_env: TOKENWARDEN_LEDGER_URL, fleet: team-a/edge, spool_dir: /var/spool/tokenwarden/ledger, spool_bytes: 1048576,
  flush_interval_seconds: 5, when_full: refuse, key_retention_hours: 48}
`))
		Expect(err).NotTo(HaveOccurred())
		l := c.Ledger
		Expect(l.URLEnv).To(Equal("TOKENWARDEN_LEDGER_URL"))
		Expect(l.Spool()).To(Equal(int64(1 << 20)))
		Expect(l.FlushInterval()).To(Equal(5 * time.Second))
		Expect(l.FullPolicy()).To(Equal(config.LedgerRefuse))
		Expect(l.KeyRetention()).To(Equal(48 * time.Hour))
	})

	DescribeTable("refuses bad values, naming the field",
		func(block, field string) {
			_, err := config.Parse([]byte(minimal + "\nledger: " + block + "\n"))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(field))
		},
		Entry("a MySQL URL", "{url: 'mysql://db/ledger'}", `ledger.url: must be a postgres://, postgresql:// or sqlite: URL, or "off"`),
		Entry("a SQLite URL without a file", "{url: 'sqlite:'}", "ledger.url: a sqlite: URL names a file"),
		Entry("a URL and its variable", "{url: 'sqlite:/tmp/l.db', url_env: L}", "ledger.url_env: is exclusive with ledger.url"),
		Entry("a negative spool", "{spool_bytes: -1}", "ledger.spool_bytes"),
		Entry("a flush every hour", "{flush_interval_seconds: 3600}", "ledger.flush_interval_seconds: must be from 1 to 300"),
		Entry("an unknown policy", "{when_full: block}", `ledger.when_full: must be "keep-serving" or "refuse", got "block"`),
		Entry("keys kept an hour", "{key_retention_hours: 1}", "ledger.key_retention_hours: must be at least 24"),
	)

	It("names a change of the ledger as one that takes a restart", func() {
		a, err := config.Parse([]byte(minimal))
		Expect(err).NotTo(HaveOccurred())
		b, err := config.Parse([]byte(minimal + "\nledger: {url: 'sqlite:/tmp/ledger.db'}\n"))
		Expect(err).NotTo(HaveOccurred())
		Expect(config.RestartRequired(a, b)).To(ConsistOf("ledger"))
	})
})
