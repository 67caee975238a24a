// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Dollars formats micro-dollars as US dollars with six decimals, exactly (no float).
func Dollars(micros int64) string {
	sign := ""
	u := uint64(micros)
	if micros < 0 {
		sign, u = "-", uint64(-micros)
	}
	return fmt.Sprintf("%s%d.%06d", sign, u/1e6, u%1e6)
}

// jsonRow is a report row as JSON: the sums, with the cost in dollars beside the
// micro-dollars.
type jsonRow struct {
	Start time.Time            `json:"start"`
	End   time.Time            `json:"end"`
	Group map[Dimension]string `json:"group"`
	Sums
	CostUSD  string `json:"cost_usd"`
	SavedUSD string `json:"saved_usd"`
}

// WriteJSON writes a report as one JSON object: the query, the rows and their total.
func WriteJSON(w io.Writer, q Query, rows []ReportRow) error {
	var total Sums
	out := struct {
		From     time.Time   `json:"from"`
		To       time.Time   `json:"to"`
		Bucket   Bucket      `json:"bucket,omitempty"`
		GroupBy  []Dimension `json:"group_by"`
		Currency string      `json:"currency"`
		Rows     []jsonRow   `json:"rows"`
		Total    jsonRow     `json:"total"`
	}{From: q.From.UTC(), To: q.To.UTC(), Bucket: q.Bucket, GroupBy: q.GroupBy, Currency: "USD", Rows: []jsonRow{}}
	if out.GroupBy == nil {
		out.GroupBy = []Dimension{}
	}
	for _, r := range rows {
		total.add(&r.Sums)
		out.Rows = append(out.Rows, jsonRow{Start: r.Start.UTC(), End: r.End.UTC(), Group: r.Group, Sums: r.Sums,
			CostUSD: Dollars(r.CostMicros), SavedUSD: Dollars(r.SavedMicros)})
	}
	out.Total = jsonRow{Start: out.From, End: out.To, Group: map[Dimension]string{}, Sums: total,
		CostUSD: Dollars(total.CostMicros), SavedUSD: Dollars(total.SavedMicros)}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// sumHeader names the sums' columns in CSV.
var sumHeader = []string{"requests", "input_tokens", "output_tokens", "cached_tokens", "cost_micro_usd", "cost_usd",
	"cache_hits", "saved_input_tokens", "saved_output_tokens", "saved_micro_usd"}

func sumFields(s *Sums) []string {
	return []string{i64(s.Requests), i64(s.InputTokens), i64(s.OutputTokens), i64(s.CachedTokens),
		i64(s.CostMicros), Dollars(s.CostMicros), i64(s.CacheHits), i64(s.SavedInput), i64(s.SavedOutput), i64(s.SavedMicros)}
}

func i64(v int64) string { return strconv.FormatInt(v, 10) }

// WriteCSV writes a report as CSV: the bucket's start and end, the dimensions grouped
// by, then the sums.
func WriteCSV(w io.Writer, q Query, rows []ReportRow) error {
	cw := csv.NewWriter(w)
	header := []string{"start", "end"}
	for _, d := range q.GroupBy {
		header = append(header, string(d))
	}
	_ = cw.Write(append(header, sumHeader...))
	for _, r := range rows {
		rec := []string{stamp(r.Start), stamp(r.End)}
		for _, d := range q.GroupBy {
			rec = append(rec, r.Group[d])
		}
		_ = cw.Write(append(rec, sumFields(&r.Sums)...))
	}
	cw.Flush()
	return cw.Error()
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// focusHeader are the FinOps FOCUS columns a report fills, then its own (x_).
var focusHeader = []string{
	"BilledCost", "EffectiveCost", "BillingCurrency", "BillingPeriodStart", "BillingPeriodEnd",
	"ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ChargeFrequency", "ChargeDescription",
	"ConsumedQuantity", "ConsumedUnit", "ProviderName", "ServiceName", "ServiceCategory",
	"SubAccountId", "ResourceId", "ResourceName", "Tags",
	"x_Requests", "x_InputTokens", "x_OutputTokens", "x_CachedTokens", "x_CacheHits", "x_SavedCost",
}

// WriteFOCUS writes a report as a FinOps FOCUS-shaped CSV for chargeback tools: a
// row is a charge of the bucket (the charge period; the billing period is the
// report's range). The upstream, when grouped by, is the provider and the service;
// the tenant namespace the sub-account; the model the resource; every dimension
// grouped by is a tag. The consumed quantity is tokens, in and out.
func WriteFOCUS(w io.Writer, q Query, rows []ReportRow) error {
	cw := csv.NewWriter(w)
	_ = cw.Write(focusHeader)
	for _, r := range rows {
		tags := map[string]string{}
		for _, d := range q.GroupBy {
			tags[string(d)] = r.Group[d]
		}
		rawTags, err := json.Marshal(tags)
		if err != nil {
			return err
		}
		service := "tokenwarden"
		if v, ok := r.Group[Upstream]; ok {
			service = v
		}
		cost := Dollars(r.CostMicros)
		_ = cw.Write([]string{
			cost, cost, "USD", stamp(q.From), stamp(q.To),
			stamp(r.Start), stamp(r.End), "Usage", "Usage-Based", describe(&r),
			i64(r.InputTokens + r.OutputTokens), "Tokens", r.Group[Upstream], service, "AI and Machine Learning",
			r.Group[Tenant], r.Group[Model], r.Group[Model], string(rawTags),
			i64(r.Requests), i64(r.InputTokens), i64(r.OutputTokens), i64(r.CachedTokens), i64(r.CacheHits), Dollars(r.SavedMicros),
		})
	}
	cw.Flush()
	return cw.Error()
}

// describe is a FOCUS row's ChargeDescription.
func describe(r *ReportRow) string {
	d := fmt.Sprintf("%d requests, %d input and %d output tokens", r.Requests, r.InputTokens, r.OutputTokens)
	if m, ok := r.Group[Model]; ok {
		d += " of " + m
	}
	return d
}
