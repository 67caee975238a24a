// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/ledger"
)

// ledgerExported is the metric families a proxy's ledger exports: the collector the
// proxy registers, on a ledger of its own.
func ledgerExported(t *testing.T) map[string]bool {
	t.Helper()
	sink, err := ledger.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sink.Close() }()
	l, err := ledger.New(ledger.Config{Sink: sink, Pod: "p", FlushInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close(t.Context()) }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(ledger.NewCollector(l, nil))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		out[mf.GetName()] = true
	}
	return out
}

// TestProxyLedger: proxyLedger becomes the operator's --proxy-ledger-* flags, and
// none of them without a Secret name; the schema refuses a bad policy or size.
func TestProxyLedger(t *testing.T) {
	helm := tool(t, "helm")
	if off := run(t, helm, "template", "tw", chartDir); strings.Contains(off, "--proxy-ledger") {
		t.Error("no default ledger without proxyLedger.secretName: no --proxy-ledger flag")
	}
	on := run(t, helm, "template", "tw", chartDir, "--set", "proxyLedger.secretName=ledger-db,proxyLedger.spoolSize=128Mi,proxyLedger.whenSpoolFull=Refuse")
	for _, want := range []string{
		"- --proxy-ledger-secret=ledger-db\n", "- --proxy-ledger-secret-key=url\n",
		"- --proxy-ledger-spool-size=128Mi\n", "- --proxy-ledger-when-spool-full=Refuse\n",
	} {
		if !strings.Contains(on, want) {
			t.Errorf("the operator's args lack %q", want)
		}
	}
	for _, c := range []struct{ set, field string }{
		{"proxyLedger.whenSpoolFull=Block", "/proxyLedger/whenSpoolFull"},
		{"proxyLedger.spoolSize=lots", "/proxyLedger/spoolSize"},
		{"proxyLedger.secret=x", "proxyLedger"},
	} {
		out, err := exec.Command(helm, "template", "tw", chartDir, "--set", c.set).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.field) {
			t.Errorf("--set %s was accepted or %s not named: %v\n%s", c.set, c.field, err, out)
		}
	}
}
