// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A committed row survives an immediate stop (a crash: the next start recovers it
// from the write-ahead log); while the server is stopped nothing answers.
func TestStopImmediateAndStartKeepTheData(t *testing.T) {
	srv := Start(t)
	url := srv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run(ctx, t, url, "CREATE TABLE t (v int)", "INSERT INTO t VALUES (42)")

	if err := srv.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if srv.Running() {
		t.Fatal("running after Stop")
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if c, err := pgx.Connect(short, url); err == nil {
		_ = c.Close(ctx)
		t.Fatal("a connection was accepted while the server was stopped")
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect after Start: %v", err)
	}
	defer func() { _ = c.Close(ctx) }()
	var v int
	if err := c.QueryRow(ctx, "SELECT v FROM t").Scan(&v); err != nil || v != 42 {
		t.Fatalf("the committed row after an immediate stop: %d, %v; want 42", v, err)
	}
}

// The server does not run as root (PostgreSQL refuses to), and each database is new.
func TestNotRootAndDatabasesApart(t *testing.T) {
	srv := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := srv.NewDatabase(t), srv.NewDatabase(t)
	run(ctx, t, a, "CREATE TABLE only_in_a (v int)")
	c, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("a table of one database seen in another: %d, %v", n, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", srv.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" && f[1] == "0" {
			t.Fatalf("the postmaster runs as root: %s", line)
		}
	}
}

// A port is free when chosen, but another process may take it before the server binds
// it: the server answering there then is not taken for this one.
func TestStartOnATakenPort(t *testing.T) {
	other := Start(t)
	s := Start(t)
	if err := s.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	s.port = other.port
	if err := s.Start(); !errors.Is(err, errPortTaken) {
		t.Fatalf("a start on the port of a running server: got %v, want the port taken", err)
	}
}

func run(ctx context.Context, t *testing.T, url string, stmts ...string) {
	t.Helper()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()
	for _, s := range stmts {
		if _, err := c.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}
