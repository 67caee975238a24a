// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/recovery"
)

// DefaultLedgerFile is the SQLite file a standalone proxy records into when its
// document names no ledger: beside the document, one replica's own record.
const DefaultLedgerFile = "tokenwarden-ledger.db"

// spendLedger is the proxy's ledger and the sink it writes to and reports from.
type spendLedger struct {
	*ledger.Ledger
	sink ledger.Sink
	// url is the database, its password redacted, for the log.
	kind string
}

// ledgerReplica names this process in the ledger's idempotency keys: the replica
// name of a fleet's pod or given by flag; a standalone proxy's host name gets its
// process id, so that two proxies on one host started in the same millisecond never
// share a key.
func ledgerReplica(fs *flag.FlagSet, name string, withConfigMap bool) string {
	given := withConfigMap || os.Getenv("POD_NAME") != ""
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "replica-name" })
	if given {
		return name
	}
	return fmt.Sprintf("%s-%d", name, os.Getpid())
}

// ledgerURL is the database the document names: ledger.url, the variable
// ledger.url_env names, or the default: beside a standalone proxy's document
// (configPath), none for a fleet's pod. "" is no ledger.
func ledgerURL(l *config.Ledger, configPath string) (url string, isDefault bool, err error) {
	switch {
	case l.URL == config.LedgerOff:
		return "", false, nil
	case l.URL != "":
		return l.URL, false, nil
	case l.URLEnv != "":
		v, ok := os.LookupEnv(l.URLEnv)
		if !ok || v == "" {
			return "", false, fmt.Errorf("ledger.url_env: the environment variable %s is not set", l.URLEnv)
		}
		return v, false, nil
	case configPath != "":
		return "sqlite:" + filepath.Join(filepath.Dir(configPath), DefaultLedgerFile), true, nil
	}
	return "", false, nil
}

// openLedger starts the ledger the first document names (nil when none): its sink
// opens the database on first use, so a database that is down delays nothing; its
// metrics go to reg. A default SQLite file that cannot be written leaves the proxy
// without a ledger, with a warning; a named ledger that cannot start stops the proxy.
func openLedger(c *config.Config, configPath, replica string, reg prometheus.Registerer, log *slog.Logger) (*spendLedger, error) {
	url, isDefault, err := ledgerURL(&c.Ledger, configPath)
	if err != nil || url == "" {
		return nil, err
	}
	sink := &ledger.Lazy{URL: url}
	kind := "postgresql"
	if url[:min(len(url), 7)] == "sqlite:" {
		kind = "sqlite"
		// A file the proxy cannot write is found now, not at the first flush.
		if _, err := sink.Open(context.Background()); err != nil {
			if isDefault {
				log.Warn("No spend ledger: the default SQLite file cannot be opened; set ledger.url", "url", url, "error", err)
				return nil, nil
			}
			return nil, err
		}
	}
	l, err := ledger.New(ledger.Config{Sink: sink, Pod: replica, SpoolDir: c.Ledger.SpoolDir, SpoolBytes: c.Ledger.Spool(),
		FlushInterval: c.Ledger.FlushInterval(), WhenFull: ledger.FullPolicy(c.Ledger.FullPolicy()),
		KeyRetention: c.Ledger.KeyRetention(), Logger: log})
	if err != nil {
		_ = sink.Close()
		return nil, err
	}
	reg.MustRegister(ledger.NewCollector(l, nil))
	log.Info("Spend ledger", "database", kind, "replica", l.Stats().Replica, "spool_dir", c.Ledger.SpoolDir,
		"flush_interval", c.Ledger.FlushInterval())
	return &spendLedger{Ledger: l, sink: sink, kind: kind}, nil
}

// withReports serves the ledger's spend reports beside the admin API's other
// endpoints, behind the same authentication (which wraps the result).
func (s *spendLedger) withReports(admin http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(ledger.ReportPath, &ledger.ReportHandler{Sink: s.sink})
	mux.Handle("/", admin)
	return mux
}

// close flushes the ledger, its spool first (the drain on termination), and closes
// the database; what stays spooled is logged, for a process of the same pod to replay.
func (s *spendLedger) close(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		log.Warn("The spend ledger stopped with batches spooled", "error", err)
	}
	_ = s.sink.Close()
}

// ledgerAttester is the attester of lost durable counters from the spend ledger: for
// a fleet on Redis whose ledger is PostgreSQL, shared by every replica (a replica's
// own SQLite file records only what it settled); nil otherwise.
func ledgerAttester(spend *spendLedger, store budget.Store, src recovery.Source, fleet string, reg prometheus.Registerer, log *slog.Logger) *recovery.Attester {
	rs, ok := store.(*redisstore.Store)
	if !ok || !attestsFromLedger(spend, store) {
		return nil
	}
	a := &recovery.Attester{Source: src, Store: rs, Report: spend.sink.Report, Fleet: fleet, Log: log}
	a.Register(reg)
	return a
}

// attestsFromLedger says lost durable counters of store can be attested from spend:
// a Redis store and a PostgreSQL ledger.
func attestsFromLedger(spend *spendLedger, store budget.Store) bool {
	_, ok := store.(*redisstore.Store)
	return ok && spend != nil && spend.kind == "postgresql"
}

// ledgerFallback puts the ledger fallback in force on a Redis store whose fleet
// records into PostgreSQL, when the config asks for it (nil otherwise).
func ledgerFallback(spend *spendLedger, store budget.Store, cfg *config.Config, reg prometheus.Registerer, log *slog.Logger) *recovery.Fallback {
	lf := cfg.RateLimiting.Redis.LedgerFallback
	rs, ok := store.(*redisstore.Store)
	if lf == nil || !ok {
		return nil
	}
	if spend == nil || spend.kind != "postgresql" {
		log.Warn("rate_limiting.redis.ledger_fallback needs the fleet's PostgreSQL spend ledger; the cost budgets fail closed while Redis is unreachable")
		return nil
	}
	f := &recovery.Fallback{Report: spend.sink.Report, Pending: spend.Pending, Fleet: cfg.Ledger.Fleet,
		Replicas: int(cfg.Divisor()), MaxConcurrent: lf.MaxConcurrent, Log: log}
	f.Register(reg)
	rs.SetDurableFallback(f)
	return f
}
