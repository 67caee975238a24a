// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"cmp"
	"strings"
	"time"
)

// Ledger is the durable record of every settlement, in per-minute rollups, for
// audit and chargeback reports (docs/ledger.md). Its defaults are read through its
// methods, not written by Default, so that a rendered document does not change with
// them. Every field is applied when the proxy starts (RestartRequired).
type Ledger struct {
	// URL is the database: postgres://USER:PASSWORD@HOST:5432/DB (the fleet's shared
	// record), sqlite:PATH (one replica's own record, no fleet record), or "off".
	// Empty: the value of URLEnv, else the proxy's default (a SQLite file beside a
	// standalone proxy's config; none for a pod of a fleet).
	URL string `json:"url,omitempty"`
	// URLEnv names an environment variable holding the URL, so that the document
	// need not carry the database's password.
	URLEnv string `json:"url_env,omitempty"`
	// Fleet is the fleet's name in the record (the operator writes the TokenProxy's
	// namespace/name).
	Fleet string `json:"fleet,omitempty"`
	// SpoolDir is where batches wait while the database is unreachable (a pod's
	// emptyDir): a restarted process replays them. Empty: in memory, lost with the
	// process.
	SpoolDir string `json:"spool_dir,omitempty"`
	// SpoolBytes bounds the spool. Absent or 0: 64 MiB.
	SpoolBytes int64 `json:"spool_bytes,omitempty"`
	// FlushIntervalSeconds is how often the rollups are written. Absent or 0: 10.
	// With SpoolBytes it bounds what a pod lost with its disk takes with it.
	FlushIntervalSeconds int64 `json:"flush_interval_seconds,omitempty"`
	// WhenFull is what the proxy does while the spool is full and the database
	// unreachable: keep-serving (the default: serve, and count what could not be
	// recorded) or refuse (refuse the requests that cost budgets govern).
	WhenFull string `json:"when_full,omitempty"`
	// KeyRetentionHours is how long the database keeps the idempotency key of each
	// batch it applied (ledger_batches); a spooled batch older than this is set
	// aside, not replayed, since its key may be gone. Absent or 0: 168 (7 days).
	KeyRetentionHours int64 `json:"key_retention_hours,omitempty"`
}

// Ledger defaults and policies.
const (
	LedgerOff                  = "off"
	LedgerKeepServing          = "keep-serving"
	LedgerRefuse               = "refuse"
	DefaultLedgerSpoolBytes    = 64 << 20
	DefaultLedgerFlushSeconds  = 10
	DefaultLedgerKeyRetentionH = 7 * 24
)

// Spool is spool_bytes in force.
func (l *Ledger) Spool() int64 { return cmp.Or(l.SpoolBytes, DefaultLedgerSpoolBytes) }

// FlushInterval is flush_interval_seconds in force.
func (l *Ledger) FlushInterval() time.Duration {
	return time.Duration(cmp.Or(l.FlushIntervalSeconds, DefaultLedgerFlushSeconds)) * time.Second
}

// FullPolicy is when_full in force.
func (l *Ledger) FullPolicy() string { return cmp.Or(l.WhenFull, LedgerKeepServing) }

// KeyRetention is key_retention_hours in force.
func (l *Ledger) KeyRetention() time.Duration {
	return time.Duration(cmp.Or(l.KeyRetentionHours, DefaultLedgerKeyRetentionH)) * time.Hour
}

// minKeyRetentionHours keeps a key at least a day: a batch whose commit answer was
// lost is retried within seconds, and a shorter retention would make an outage of a
// few hours enough to set spooled batches aside.
const minKeyRetentionHours = 24

func (c *Config) validateLedger(errs *fieldErrors) {
	l := &c.Ledger
	switch u := l.URL; {
	case u == "", u == LedgerOff, strings.HasPrefix(u, "postgres://"), strings.HasPrefix(u, "postgresql://"):
	case strings.HasPrefix(u, "sqlite:"):
		if strings.TrimPrefix(u, "sqlite:") == "" {
			errs.add("ledger.url", "a sqlite: URL names a file, as in sqlite:/var/lib/tokenwarden/ledger.db")
		}
	default:
		errs.add("ledger.url", "must be a postgres://, postgresql:// or sqlite: URL, or %q", LedgerOff)
	}
	if l.URL != "" && l.URLEnv != "" {
		errs.add("ledger.url_env", "is exclusive with ledger.url")
	}
	if l.SpoolBytes < 0 {
		errs.add("ledger.spool_bytes", "must be 0 or more, got %d", l.SpoolBytes)
	}
	if l.FlushIntervalSeconds < 0 || l.FlushIntervalSeconds > 300 {
		errs.add("ledger.flush_interval_seconds", "must be from 1 to 300, got %d", l.FlushIntervalSeconds)
	}
	switch l.WhenFull {
	case "", LedgerKeepServing, LedgerRefuse:
	default:
		errs.add("ledger.when_full", "must be %q or %q, got %q", LedgerKeepServing, LedgerRefuse, l.WhenFull)
	}
	if h := l.KeyRetentionHours; h != 0 && h < minKeyRetentionHours {
		errs.add("ledger.key_retention_hours", "must be at least %d, got %d", minKeyRetentionHours, h)
	}
}
