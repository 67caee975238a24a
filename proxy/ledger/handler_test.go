// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgertest"
)

var _ = Describe("the spend report endpoint", func() {
	var (
		records []ledger.Record
		srv     *httptest.Server
	)
	BeforeEach(func() {
		ctx := context.Background()
		sink, err := ledger.Open(ctx, "sqlite:"+filepath.Join(GinkgoT().TempDir(), "ledger.db"))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(sink.Close)
		l, err := ledger.New(ledger.Config{Sink: sink, Pod: "proxy-0", FlushInterval: -1})
		Expect(err).NotTo(HaveOccurred())
		records = ledgertest.AddConcurrently(l, 2, 400)
		Expect(l.Close(ctx)).To(Succeed())
		srv = httptest.NewServer(&ledger.ReportHandler{Sink: sink})
		DeferCleanup(srv.Close)
	})
	get := func(query string) (int, http.Header, string) {
		resp, err := http.Get(srv.URL + ledger.ReportPath + "?" + query)
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		return resp.StatusCode, resp.Header, string(b)
	}
	from, to := ledgertest.All().From, ledgertest.All().To
	rangeOf := "from=" + url.QueryEscape(from.Format("2006-01-02T15:04:05Z07:00")) + "&to=" + url.QueryEscape(to.Format("2006-01-02T15:04:05Z07:00"))

	It("answers JSON grouped by team and model per hour, whose rows equal the settlements' sums", func() {
		code, h, body := get(rangeOf + "&group_by=team,model&bucket=hour")
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(h.Get("Content-Type")).To(Equal("application/json"))
		var out struct {
			Rows []struct {
				ledger.ReportRow
				Group map[ledger.Dimension]string `json:"group"`
			} `json:"rows"`
			Total struct {
				ledger.Sums
				CostUSD string `json:"cost_usd"`
			} `json:"total"`
		}
		Expect(json.Unmarshal([]byte(body), &out)).To(Succeed())
		q := ledger.Query{From: from, To: to, Bucket: ledger.Hour, GroupBy: []ledger.Dimension{ledger.Team, ledger.Model}}
		var rows []ledger.ReportRow
		for _, r := range out.Rows {
			r.ReportRow.Group = r.Group
			rows = append(rows, r.ReportRow)
		}
		Expect(ledgertest.Got(q, rows)).To(Equal(ledgertest.Expected(q, records)))
		Expect(out.Total.Sums).To(Equal(ledgertest.Total(records)))
		Expect(out.Total.CostUSD).To(Equal(ledger.Dollars(ledgertest.Total(records).CostMicros)))
	})

	It("answers one tenant's CSV by key, and a FOCUS CSV whose billed costs add up to the total", func() {
		code, h, body := get(rangeOf + "&group_by=api_key&format=csv&tenant=team-a-ns")
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(h.Get("Content-Type")).To(HavePrefix("text/csv"))
		Expect(h.Get("Content-Disposition")).To(ContainSubstring(".csv"))
		recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
		Expect(err).NotTo(HaveOccurred())
		Expect(recs[0][:3]).To(Equal([]string{"start", "end", "api_key"}))
		var requests int64
		for _, r := range recs[1:] {
			n, err := strconv.ParseInt(r[3], 10, 64)
			Expect(err).NotTo(HaveOccurred())
			requests += n
		}
		var mine int64
		for _, r := range records {
			if r.Tenant == "team-a-ns" {
				mine++
			}
		}
		Expect(requests).To(Equal(mine))

		code, _, body = get(rangeOf + "&group_by=tenant,model&bucket=day&format=focus")
		Expect(code).To(Equal(http.StatusOK), body)
		recs, err = csv.NewReader(strings.NewReader(body)).ReadAll()
		Expect(err).NotTo(HaveOccurred())
		Expect(recs[0][0]).To(Equal("BilledCost"))
		var micros int64
		for _, r := range recs[1:] {
			whole, frac, _ := strings.Cut(r[0], ".")
			w, _ := strconv.ParseInt(whole, 10, 64)
			f, _ := strconv.ParseInt(frac, 10, 64)
			micros += w*1e6 + f
		}
		Expect(micros).To(Equal(ledgertest.Total(records).CostMicros))
	})

	DescribeTable("refuses a bad query with 400, naming what is wrong",
		func(query, says string) {
			code, _, body := get(query)
			Expect(code).To(Equal(http.StatusBadRequest))
			Expect(body).To(ContainSubstring(says))
		},
		Entry("an unknown dimension", "group_by=project", `cannot group by "project"`),
		Entry("a typo", "gruop_by=team", `unknown parameter "gruop_by"`),
		Entry("a range backwards", "from=2026-11-02&to=2026-11-01", "the report's range is empty"),
		Entry("a range of two years", "from=2025-01-01&to=2027-01-01", "longer than 366 days"),
		Entry("a time that is none", "from=yesterday", "from: want RFC 3339"),
		Entry("a bucket of a week", "bucket=week", `no bucket "week"`),
		Entry("a format of its own", "format=xlsx", "format: want json, csv or focus"),
	)

	It("answers 503 while the database does not answer", func() {
		down := httptest.NewServer(&ledger.ReportHandler{Sink: &ledger.Lazy{URL: "postgres://tw@127.0.0.1:1/ledger?connect_timeout=1"}})
		defer down.Close()
		resp, err := http.Get(down.URL + ledger.ReportPath)
		Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusServiceUnavailable))
		Expect(resp.Header.Get("Retry-After")).To(Equal("5"))
	})
})
