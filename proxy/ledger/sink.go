// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the pgx driver for database/sql
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	_ "modernc.org/sqlite" // the pure-Go SQLite driver
)

// Sink is where the ledger's rollups are recorded and reports are read.
type Sink interface {
	// Apply adds a batch's rows, once: false (and no error) when a batch of the same
	// key was applied before.
	Apply(ctx context.Context, b *Batch) (applied bool, err error)
	// Prune deletes the idempotency keys of batches applied before the time, and
	// returns how many.
	Prune(ctx context.Context, before time.Time) (int64, error)
	// Report sums the rows a query selects.
	Report(ctx context.Context, q Query) ([]ReportRow, error)
	// Close closes the database.
	Close() error
}

//go:embed migrations/*.sql
var migrations embed.FS

// SchemaVersion is the schema version this build migrates to.
const SchemaVersion = 3

// versionTable is goose's table of applied migrations.
const versionTable = "ledger_schema_version"

// lockID is the PostgreSQL advisory lock that migrations run under (a session lock:
// one replica migrates, the others wait, then find nothing to do).
const lockID = 0x746f6b656e77 // "tokenw"

// dialect is what differs between PostgreSQL and SQLite.
type dialect struct {
	name  goose.Dialect
	param func(i int) string // the i-th (1-based) placeholder
	// maxParams is how many parameters one statement takes.
	maxParams int
}

var (
	postgres = dialect{name: goose.DialectPostgres, param: func(i int) string { return "$" + strconv.Itoa(i) }, maxParams: 65535}
	sqlite   = dialect{name: goose.DialectSQLite3, param: func(int) string { return "?" }, maxParams: 32766}
)

// SQLSink is a Sink on PostgreSQL or SQLite.
type SQLSink struct {
	db         *sql.DB
	d          dialect
	migrations *goose.Provider
	now        func() time.Time
}

// Open opens the sink a URL names and migrates it to SchemaVersion:
// postgres:// or postgresql:// (PostgreSQL, through pgx), or sqlite:PATH (a file;
// sqlite::memory: for one in memory).
func Open(ctx context.Context, url string) (*SQLSink, error) {
	return OpenVersion(ctx, url, SchemaVersion)
}

// OpenVersion is Open, migrating only up to version (a test of the path from an
// earlier schema).
func OpenVersion(ctx context.Context, url string, version int64) (*SQLSink, error) {
	s, err := open(url)
	if err != nil {
		return nil, err
	}
	if err := s.migrate(ctx, version); err != nil {
		_ = s.db.Close()
		return nil, err
	}
	return s, nil
}

func open(url string) (*SQLSink, error) {
	switch {
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		db, err := sql.Open("pgx", url)
		if err != nil {
			return nil, fmt.Errorf("ledger: %w", err)
		}
		db.SetMaxOpenConns(8)
		db.SetMaxIdleConns(8)
		db.SetConnMaxIdleTime(5 * time.Minute)
		return &SQLSink{db: db, d: postgres, now: time.Now}, nil
	case strings.HasPrefix(url, "sqlite:"):
		path := strings.TrimPrefix(url, "sqlite:")
		if path == "" {
			return nil, errors.New("ledger: sqlite: no file")
		}
		// One connection: SQLite has one writer, and a reader on the same file waits
		// for it through the busy timeout.
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
		if err != nil {
			return nil, fmt.Errorf("ledger: %w", err)
		}
		db.SetMaxOpenConns(1)
		return &SQLSink{db: db, d: sqlite, now: time.Now}, nil
	}
	return nil, fmt.Errorf("ledger: %q is neither a postgres:// nor a sqlite: URL", redact(url))
}

// redact drops a URL's password for messages.
func redact(url string) string {
	if at := strings.LastIndex(url, "@"); at > 0 {
		if scheme := strings.Index(url, "://"); scheme > 0 && scheme < at {
			return url[:scheme+3] + "…" + url[at:]
		}
	}
	return url
}

// migrate applies the embedded migrations up to version. On PostgreSQL it holds a
// session advisory lock meanwhile (goose's session locker: pg_try_advisory_lock on one
// connection, tried every second for up to five minutes, released at the end), so that
// of many replicas starting at once one migrates and the others wait, then find
// nothing left to do. SQLite has one writer and needs none. A next schema is a new
// numbered file in migrations/, in the SQL both databases share, or a file per
// dialect once one needs SQL the other lacks.
func (s *SQLSink) migrate(ctx context.Context, version int64) error {
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithTableName(versionTable), goose.WithDisableGlobalRegistry(true)}
	if s.d.name == goose.DialectPostgres {
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 300))
		if err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		opts = append(opts, goose.WithSessionLocker(locker))
	}
	p, err := goose.NewProvider(s.d.name, s.db, fsys, opts...)
	if err != nil {
		return fmt.Errorf("ledger: migrations: %w", err)
	}
	s.migrations = p
	if _, err := p.UpTo(ctx, version); err != nil {
		return fmt.Errorf("ledger: migrate to version %d: %w", version, err)
	}
	return nil
}

// Version is the schema version the database is at.
func (s *SQLSink) Version(ctx context.Context) (int64, error) {
	v, err := s.migrations.GetDBVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("ledger: %w", err)
	}
	return v, nil
}

// DB is the database, for tests and tools.
func (s *SQLSink) DB() *sql.DB { return s.db }

// Close closes the database.
func (s *SQLSink) Close() error { return s.db.Close() }

// rollupColumns are the columns a batch writes, in its rows' order.
var rollupColumns = []string{
	"minute", "fleet", "tenant", "api_key", "user_name", "team", "model", "upstream",
	"requests", "input_tokens", "output_tokens", "cached_tokens", "cost_micro_usd",
	"cache_hits", "saved_input_tokens", "saved_output_tokens", "saved_micro_usd",
}

// sumColumns are the columns an applied row adds to.
var sumColumns = rollupColumns[8:]

func rowArgs(r *Row) []any {
	return []any{
		r.Minute, r.Fleet, r.Tenant, r.APIKey, r.User, r.Team, r.Model, r.Upstream,
		r.Requests, r.InputTokens, r.OutputTokens, r.CachedTokens, r.CostMicros,
		r.CacheHits, r.SavedInput, r.SavedOutput, r.SavedMicros,
	}
}

// Apply adds the batch's rows in one transaction with its key: a key there already
// means the batch was applied, and nothing is added.
func (s *SQLSink) Apply(ctx context.Context, b *Batch) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	p := s.d.param
	res, err := tx.ExecContext(ctx, "INSERT INTO ledger_batches (replica, seq, rows, applied_at) VALUES ("+
		p(1)+", "+p(2)+", "+p(3)+", "+p(4)+") ON CONFLICT (replica, seq) DO NOTHING",
		b.Replica, b.Seq, len(b.Rows), s.now().Unix())
	if err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	rows := b.Rows
	if !slices.IsSortedFunc(rows, func(a, b Row) int { return compareRows(&a, &b) }) {
		rows = slices.Clone(rows)
		slices.SortFunc(rows, func(a, b Row) int { return compareRows(&a, &b) })
	}
	per := s.d.maxParams / len(rollupColumns)
	for start := 0; start < len(rows); start += per {
		if err := s.upsert(ctx, tx, rows[start:min(start+per, len(rows))]); err != nil {
			return false, err
		}
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	return true, nil
}

// Prune deletes the idempotency keys of the batches applied before the time.
func (s *SQLSink) Prune(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, "DELETE FROM ledger_batches WHERE applied_at < "+s.d.param(1), before.Unix())
	if err != nil {
		return 0, fmt.Errorf("ledger: prune: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("ledger: prune: %w", err)
	}
	return n, nil
}

// upsert adds rows (in key order, which is the order every replica locks them in) in
// one statement.
func (s *SQLSink) upsert(ctx context.Context, tx *sql.Tx, rows []Row) error {
	var q strings.Builder
	q.WriteString("INSERT INTO ledger_rollups (" + strings.Join(rollupColumns, ", ") + ") VALUES ")
	args := make([]any, 0, len(rows)*len(rollupColumns))
	for i := range rows {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteByte('(')
		for j := range rollupColumns {
			if j > 0 {
				q.WriteString(", ")
			}
			q.WriteString(s.d.param(len(args) + j + 1))
		}
		q.WriteByte(')')
		args = append(args, rowArgs(&rows[i])...)
	}
	q.WriteString(" ON CONFLICT (minute, fleet, tenant, api_key, user_name, team, model, upstream) DO UPDATE SET ")
	for i, c := range sumColumns {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString(c + " = ledger_rollups." + c + " + excluded." + c)
	}
	if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	return nil
}
