// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
)

// TestLedgerURL: where a proxy records its spend, from the document, its variable
// or the default (a SQLite file beside a standalone proxy's document, none in a pod).
func TestLedgerURL(t *testing.T) {
	t.Setenv("TW_TEST_LEDGER", "postgres://tw:pw@pg:5432/ledger")
	for _, c := range []struct {
		name       string
		l          config.Ledger
		configPath string
		want       string
		err        string
	}{
		{"standalone default", config.Ledger{}, "/etc/tw/proxy.yaml", "sqlite:/etc/tw/tokenwarden-ledger.db", ""},
		{"a pod's default", config.Ledger{}, "", "", ""},
		{"off", config.Ledger{URL: "off"}, "/etc/tw/proxy.yaml", "", ""},
		{"named", config.Ledger{URL: "sqlite:/data/l.db"}, "", "sqlite:/data/l.db", ""},
		{"from the environment", config.Ledger{URLEnv: "TW_TEST_LEDGER"}, "", "postgres://tw:pw@pg:5432/ledger", ""},
		{"a variable not set", config.Ledger{URLEnv: "TW_TEST_NO_LEDGER"}, "", "", "TW_TEST_NO_LEDGER is not set"},
	} {
		got, _, err := ledgerURL(&c.l, c.configPath)
		if got != c.want || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: got %q, %v; want %q, %q", c.name, got, err, c.want, c.err)
		}
	}
}

// TestStandaloneLedger: a standalone proxy records into its default SQLite file and
// serves reports beside the admin API; one whose directory cannot hold it runs
// without a ledger.
func TestStandaloneLedger(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	spend, err := openLedger(&config.Config{}, filepath.Join(dir, "proxy.yaml"), "host-1", prometheus.NewRegistry(), log)
	if err != nil || spend == nil {
		t.Fatalf("want the default ledger, got %v, %v", spend, err)
	}
	defer spend.close(log)
	if _, err := os.Stat(filepath.Join(dir, DefaultLedgerFile)); err != nil {
		t.Errorf("the SQLite file: %v", err)
	}
	admin := spend.withReports(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("admin")) }))
	for path, want := range map[string]string{ledger.ReportPath: `"currency": "USD"`, "/admin/effective": "admin"} {
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("%s: want %q, got %d %q", path, want, rec.Code, rec.Body.String())
		}
	}
	missing := filepath.Join(dir, "missing", "deeper", "proxy.yaml")
	if err := os.WriteFile(filepath.Join(dir, "missing"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if spend, err := openLedger(&config.Config{}, missing, "host-1", prometheus.NewRegistry(), log); spend != nil || err != nil {
		t.Errorf("a default file that cannot be written: want no ledger and no error, got %v, %v", spend, err)
	}
}
