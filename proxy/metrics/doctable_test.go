// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package metrics_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/adminauth"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/recovery"
)

// docRow is a row of a metrics table in docs/: its first cell names one or more
// metrics (`name`, or `name{label, label}`), its second their labels (when the names
// carry none).
var docRow = regexp.MustCompile("(?m)^\\| (`(?:rate_limit|tokenwarden)_[^|]*)\\|([^|]*)\\|")

// docName is one metric of a row's first cell, with its labels in braces, if any.
var docName = regexp.MustCompile("`((?:rate_limit|tokenwarden)_[a-z_]+)(?:\\{([a-z_, ]*)\\})?`")

// descLabels reads a Desc's name and variable labels from its String form.
var descLabels = regexp.MustCompile(`fqName: "([a-z_]+)".*variableLabels: \{([a-z_,]*)\}`)

// registering are the packages whose collectors the spec registers below, by their
// directory under proxy/.
var registering = []string{"adminauth", "ledger", "metrics", "recovery"}

// TestTheMetricsTablesNameWhatTheProxyExports: every metric the proxy registers
// (metrics.New, the ledger's collector, the ledger attester's and fallback's counters,
// the admin API's reviews) has a row in a metrics table of docs/ (proxy.md's, or the
// table of the page about it), with the labels it exports.
func TestTheMetricsTablesNameWhatTheProxyExports(t *testing.T) {
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string][]string{}
	for _, p := range pages {
		doc, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range docRow.FindAllStringSubmatch(string(doc), -1) {
			for _, m := range docName.FindAllStringSubmatch(row[1], -1) {
				labels := labelList(m[2])
				if !strings.Contains(m[0], "{") {
					labels = labelCell(row[2])
				}
				documented[m[1]] = labels
			}
		}
	}
	if len(documented) < 30 {
		t.Fatalf("found only %d rows in the metrics tables of docs/; the pattern is broken", len(documented))
	}
	reg := &recorder{Registerer: prometheus.NewRegistry()}
	metrics.New(reg)
	reg.MustRegister(ledger.NewCollector(nil, nil))
	(&recovery.Attester{}).Register(reg)
	(&recovery.Fallback{}).Register(reg)
	adminauth.New(adminauth.Options{Registerer: reg})
	ch := make(chan *prometheus.Desc, 1024)
	for _, c := range reg.cs {
		c.Describe(ch)
	}
	close(ch)
	for d := range ch {
		m := descLabels.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		name, labels := m[1], labelList(m[2])
		want, ok := documented[name]
		if !ok {
			t.Errorf("no metrics table of docs/ has a row for %s (labels %v)", name, labels)
			continue
		}
		if !slices.Equal(want, labels) {
			t.Errorf("%s: docs/ say labels %v, the proxy exports %v", name, want, labels)
		}
	}
}

// newMetric is a call that makes a collector or a metric's description.
var newMetric = regexp.MustCompile(`prometheus\.New(Counter|Gauge|Histogram|Summary|Untyped|Desc)`)

// TestTheMetricsTablesSpecRegistersEveryPackagesMetrics: a package of the proxy that
// makes metrics is one the metrics tables' spec registers, so none of its metrics can
// go without a row.
func TestTheMetricsTablesSpecRegistersEveryPackagesMetrics(t *testing.T) {
	found := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if newMetric.Match(src) {
			found[filepath.ToSlash(filepath.Dir(path))[len("../"):]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range found {
		if !slices.Contains(registering, dir) {
			t.Errorf("proxy/%s makes metrics the metrics tables' spec does not register: register its collectors there", dir)
		}
	}
	if len(found) < len(registering) {
		t.Errorf("found metrics made in %v only; the pattern is broken", found)
	}
}

var labelName = regexp.MustCompile(`^[a-z_]+$`)

// labelCell is a table's labels cell (`model`, `type`), or none when the cell says
// what the metric is instead.
func labelCell(cell string) []string {
	labels := labelList(strings.ReplaceAll(cell, "`", ""))
	for _, l := range labels {
		if !labelName.MatchString(l) {
			return nil
		}
	}
	return labels
}

func labelList(s string) []string {
	var out []string
	for l := range strings.SplitSeq(s, ",") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// recorder keeps the collectors registered through it.
type recorder struct {
	prometheus.Registerer
	cs []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.cs = append(r.cs, c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.cs = append(r.cs, cs...)
	r.Registerer.MustRegister(cs...)
}
