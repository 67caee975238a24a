// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgertest"
)

var _ = DescribeTable("dollars from micro-dollars, exactly",
	func(micros int64, want string) { Expect(ledger.Dollars(micros)).To(Equal(want)) },
	Entry("nothing", int64(0), "0.000000"),
	Entry("one micro-dollar", int64(1), "0.000001"),
	Entry("just under a dollar", int64(999999), "0.999999"),
	Entry("a dollar", int64(1000000), "1.000000"),
	Entry("more than float64 holds exactly in dollars", int64(9007199254740993), "9007199254.740993"),
	Entry("a credit", int64(-1500000), "-1.500000"),
)

// micros parses a dollar amount with six decimals back into micro-dollars.
func micros(s string) int64 {
	whole, frac, ok := strings.Cut(s, ".")
	ExpectWithOffset(1, ok).To(BeTrue(), s)
	n, err := strconv.ParseInt(whole+frac, 10, 64)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return n
}

var _ = Describe("a report as a file", func() {
	var (
		ctx     context.Context
		sink    *ledger.SQLSink
		records []ledger.Record
		q       ledger.Query
		rows    []ledger.ReportRow
	)
	BeforeEach(func() {
		ctx = context.Background()
		var err error
		sink, err = ledger.Open(ctx, "sqlite:"+filepath.Join(GinkgoT().TempDir(), "ledger.db"))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(sink.Close)
		l, err := ledger.New(ledger.Config{Sink: sink, Pod: "proxy-0", FlushInterval: -1})
		Expect(err).NotTo(HaveOccurred())
		records = ledgertest.AddConcurrently(l, 2, 400)
		Expect(l.Close(ctx)).To(Succeed())
		q = ledger.Query{From: ledgertest.Base.Add(-time.Hour), To: ledgertest.Base.Add(2 * time.Hour), Bucket: ledger.Hour,
			GroupBy: []ledger.Dimension{ledger.Tenant, ledger.Team, ledger.Model, ledger.Upstream}}
		rows, err = sink.Report(ctx, q)
		Expect(err).NotTo(HaveOccurred())
		Expect(len(rows)).To(BeNumerically(">", 10))
	})

	It("as JSON, totals what every settlement cost", func() {
		var buf bytes.Buffer
		Expect(ledger.WriteJSON(&buf, q, rows)).To(Succeed())
		var doc struct {
			Currency string `json:"currency"`
			Rows     []struct {
				Group   map[string]string `json:"group"`
				Cost    int64             `json:"cost_micro_usd"`
				CostUSD string            `json:"cost_usd"`
			} `json:"rows"`
			Total struct {
				Requests int64  `json:"requests"`
				Cost     int64  `json:"cost_micro_usd"`
				CostUSD  string `json:"cost_usd"`
			} `json:"total"`
		}
		Expect(json.Unmarshal(buf.Bytes(), &doc)).To(Succeed())
		Expect(doc.Currency).To(Equal("USD"))
		Expect(doc.Rows).To(HaveLen(len(rows)))
		var sum int64
		for _, r := range doc.Rows {
			Expect(r.Group).To(HaveKey("team"))
			Expect(micros(r.CostUSD)).To(Equal(r.Cost))
			sum += r.Cost
		}
		want := ledgertest.Total(records)
		Expect(sum).To(Equal(want.CostMicros))
		Expect(doc.Total.Cost).To(Equal(want.CostMicros))
		Expect(micros(doc.Total.CostUSD)).To(Equal(want.CostMicros))
		Expect(doc.Total.Requests).To(Equal(want.Requests))
	})

	It("as CSV, has a column per dimension grouped by and sums to the total", func() {
		var buf bytes.Buffer
		Expect(ledger.WriteCSV(&buf, q, rows)).To(Succeed())
		recs, err := csv.NewReader(&buf).ReadAll()
		Expect(err).NotTo(HaveOccurred())
		Expect(recs[0][:7]).To(Equal([]string{"start", "end", "tenant", "team", "model", "upstream", "requests"}))
		Expect(recs).To(HaveLen(len(rows) + 1))
		var reqs, cost int64
		for _, r := range recs[1:] {
			n, _ := strconv.ParseInt(r[6], 10, 64)
			reqs += n
			cost += micros(r[11])
		}
		Expect(reqs).To(Equal(ledgertest.Total(records).Requests))
		Expect(cost).To(Equal(ledgertest.Total(records).CostMicros))
	})

	It("as FOCUS CSV, bills the total in USD per hour, with the groups as tags", func() {
		var buf bytes.Buffer
		Expect(ledger.WriteFOCUS(&buf, q, rows)).To(Succeed())
		recs, err := csv.NewReader(&buf).ReadAll()
		Expect(err).NotTo(HaveOccurred())
		col := map[string]int{}
		for i, h := range recs[0] {
			col[h] = i
		}
		for _, c := range []string{"BilledCost", "BillingCurrency", "ChargePeriodStart", "ChargePeriodEnd", "ServiceName", "ResourceId", "Tags"} {
			Expect(col).To(HaveKey(c))
		}
		var billed int64
		for _, r := range recs[1:] {
			billed += micros(r[col["BilledCost"]])
			Expect(r[col["BillingCurrency"]]).To(Equal("USD"))
			start, err := time.Parse(time.RFC3339, r[col["ChargePeriodStart"]])
			Expect(err).NotTo(HaveOccurred())
			end, err := time.Parse(time.RFC3339, r[col["ChargePeriodEnd"]])
			Expect(err).NotTo(HaveOccurred())
			Expect(end.Sub(start)).To(Equal(time.Hour))
			var tags map[string]string
			Expect(json.Unmarshal([]byte(r[col["Tags"]]), &tags)).To(Succeed())
			Expect(tags).To(HaveKey("tenant"))
			Expect(r[col["ResourceId"]]).To(Equal(tags["model"]))
			Expect(r[col["ServiceName"]]).To(Equal(tags["upstream"]))
		}
		Expect(billed).To(Equal(ledgertest.Total(records).CostMicros))
	})
})
