// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package pgserver starts a real PostgreSQL for tests: a fresh cluster on a free
// loopback port, run as an unprivileged user, stoppable and restartable with its data,
// and always cleaned up when the test ends.
//
// It needs Debian's postgresql package (initdb and postgres from
// /usr/lib/postgresql/*/bin, or $PG_BINDIR). PostgreSQL refuses to run as root: a test
// running as root runs the server as the postgres user the package creates (or
// nobody), which must be able to enter the system temporary directory; the cluster
// directory is created there and given to that user.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokenwarden/tokenwarden/test/testproc"
)

// TB is the part of testing.TB (and of Ginkgo's GinkgoT()) that the helper needs.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Server is one PostgreSQL cluster: its data directory and, while it runs, its
// postmaster process bound to 127.0.0.1 on a fixed port.
type Server struct {
	bin  string
	dir  string // owned by the server's user: data/, the socket and the log
	port int
	cred *syscall.Credential

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    *testproc.Tail
	dbs    int
}

// BinDir is the directory of PostgreSQL's server programs: $PG_BINDIR when set,
// otherwise the newest /usr/lib/postgresql/*/bin that has initdb.
func BinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		return "", errors.New("no /usr/lib/postgresql/*/bin/initdb: install Debian's postgresql package, or set PG_BINDIR")
	}
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	return filepath.Dir(found[0]), nil
}

// version is the major version in a /usr/lib/postgresql/N/bin path.
func version(p string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return n
}

// Start creates a cluster (initdb, trust authentication for the superuser postgres),
// starts it on a free loopback port and waits until it answers, and registers its
// removal with t.Cleanup. Without PostgreSQL's programs the test is skipped, saying so.
func Start(t TB) *Server {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Skipf("pgserver: %v", err)
	}
	cred, err := credential()
	if err != nil {
		t.Fatalf("pgserver: %v", err)
	}
	s := &Server{bin: bin, cred: cred, out: &testproc.Tail{}}
	if s.dir, err = s.mkdir(); err != nil {
		t.Fatalf("pgserver: %v", err)
	}
	t.Cleanup(func() {
		_ = s.Kill()
		_ = os.RemoveAll(s.dir)
	})
	if err := s.initdb(); err != nil {
		t.Fatalf("pgserver: %v", err)
	}
	for attempt := 1; ; attempt++ {
		if s.port, err = testproc.FreePort(); err != nil {
			t.Fatalf("pgserver: no free port: %v", err)
		}
		err = s.Start()
		if err == nil {
			return s
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			t.Fatalf("pgserver: %v", err)
		}
	}
}

// credential is the user the server runs as: nil (this process's) unless it is root,
// then the postgres user, or nobody.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, errors.New("running as root, and neither a postgres nor a nobody user exists to run the server as")
}

// mkdir makes the cluster's directory, given to the server's user.
func (s *Server) mkdir() (string, error) {
	dir, err := os.MkdirTemp("", "tokenwarden-pg-")
	if err != nil {
		return "", err
	}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return dir, fmt.Errorf("give %s to uid %d: %w", dir, s.cred.Uid, err)
		}
	}
	return dir, nil
}

// initdb creates the data directory: no fsync (a test's data need not survive the
// machine), UTF-8, the superuser postgres trusted on loopback and the socket.
func (s *Server) initdb() error {
	cmd := s.command("initdb", "-D", s.dataDir(), "-U", "postgres", "--auth=trust", "-E", "UTF8",
		"--locale=C", "--no-sync", "--no-instructions")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	return nil
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

// command runs one of PostgreSQL's programs as the server's user.
func (s *Server) command(prog string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, prog), args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Port is the server's port.
func (s *Server) Port() int { return s.port }

// DataDir is the cluster's data directory.
func (s *Server) DataDir() string { return s.dataDir() }

// URL is a postgres:// URL of database db as the superuser postgres.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// NewDatabase creates an empty database of its own and returns its URL.
func (s *Server) NewDatabase(t TB) string {
	t.Helper()
	s.mu.Lock()
	s.dbs++
	name := fmt.Sprintf("test_%d", s.dbs)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatalf("pgserver: %v", err)
	}
	defer func() { _ = c.Close(ctx) }()
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgserver: create database %s: %v", name, err)
	}
	return s.URL(name)
}

// Start starts the postmaster on the server's port with the data it has, and waits
// until the server answering there is this one. Starting a running server does
// nothing. Commits are acknowledged once written to the write-ahead log
// (synchronous_commit stays on), so an immediate stop loses none; fsync is off, since
// only a crash of the machine would lose what is written.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := s.command("postgres", "-D", s.dataDir(), "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+s.dir,
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=100", "-c", "shared_buffers=32MB", "-c", "log_min_messages=warning")
	s.out.Reset()
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for s.answers() != nil {
		select {
		case <-exited:
			if strings.Contains(s.out.String(), "Address already in use") {
				return fmt.Errorf("%w: %s", errPortTaken, s.out.String())
			}
			return fmt.Errorf("postgres exited at start: %s", s.out.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("postgres did not answer on port %d within 30s: %s", s.port, s.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.cmd, s.exited = cmd, exited
	return nil
}

// errPortTaken is a server that exited because its port was taken.
var errPortTaken = errors.New("its port was taken")

// answers checks that the server on the port is this cluster: its data directory is
// ours (a server of another test could hold the port).
func (s *Server) answers() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(ctx) }()
	var dir string
	if err := c.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return err
	}
	if dir != s.dataDir() {
		return fmt.Errorf("another server answers on port %d (data directory %s)", s.port, dir)
	}
	return nil
}

// Stop shuts the server down in one of pg_ctl's modes, and waits until it has
// exited: "smart" (SIGTERM: waits for the clients), "fast" (SIGINT: disconnects
// them, a clean shutdown) or "immediate" (SIGQUIT: every process exits at once, as on
// a crash; the next start recovers from the write-ahead log, committed transactions
// kept). Stopping a stopped server does nothing.
func (s *Server) Stop(mode string) error {
	sig := map[string]syscall.Signal{"smart": syscall.SIGTERM, "fast": syscall.SIGINT, "immediate": syscall.SIGQUIT}[mode]
	if sig == 0 {
		return fmt.Errorf("pgserver: no stop mode %q (smart, fast or immediate)", mode)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
	return nil
}

// Kill stops the server at once, as Stop("immediate") does.
func (s *Server) Kill() error { return s.Stop("immediate") }

// Restart stops the server in mode and starts it again on the same port with its data.
func (s *Server) Restart(mode string) error {
	if err := s.Stop(mode); err != nil {
		return err
	}
	return s.Start()
}

// Running reports whether the postmaster is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}
