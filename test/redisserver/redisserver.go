// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package redisserver starts a real redis-server for tests: on a free loopback port,
// with no persistence, killable, pausable and restartable on the same port, and always
// cleaned up when the test ends.
package redisserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/test/testproc"
)

// TB is the part of testing.TB (and of Ginkgo's GinkgoT()) that the helper needs.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// Server is one redis-server process bound to 127.0.0.1 on a fixed port.
type Server struct {
	port int
	dir  string
	// conf is a config file the server starts from (a sentinel's); args are added to
	// the command line (a cluster node's, a sentinel's).
	conf string
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	// admin is a client of this node alone, for the cluster and sentinel helpers.
	admin *redis.Client
}

// Binary is the redis-server executable that Start runs: $REDIS_SERVER when set,
// otherwise the first redis-server on PATH.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found on PATH (install Debian's redis-server package, or set REDIS_SERVER): %w", err)
	}
	return p, nil
}

// Start starts a redis-server on a free loopback port and registers its shutdown with
// t.Cleanup. A missing binary fails the test: the Redis suites never skip.
func Start(t TB) *Server {
	t.Helper()
	return startWith(t, nil)
}

// startWith starts a server from the config file and with the extra arguments setup
// gives for its port and directory.
// A port is free when chosen, but another process of the host may take it before the
// server binds it: then the server starts again on another.
func startWith(t TB, setup func(port int, dir string) (conf string, args []string)) *Server {
	t.Helper()
	var s *Server
	for attempt := 1; ; attempt++ {
		port, err := testproc.FreePort()
		if err != nil {
			t.Fatalf("redisserver: no free port: %v", err)
		}
		s = &Server{port: port, dir: mkdirTemp(t)}
		if setup != nil {
			s.conf, s.args = setup(port, s.dir)
		}
		err = s.start()
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			t.Fatalf("redisserver: %v", err)
		}
	}
	t.Cleanup(func() {
		_ = s.Kill()
		s.mu.Lock()
		if s.admin != nil {
			_ = s.admin.Close()
		}
		s.mu.Unlock()
		_ = os.RemoveAll(s.dir)
	})
	return s
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// waitSynced waits until every replica's link to its master is up.
func waitSynced(t TB, replicas []*Server) {
	t.Helper()
	for _, r := range replicas {
		eventually(t, 20*time.Second, "replica "+r.Addr()+" is in sync", func() error {
			info, err := r.client().Info(context.Background(), "replication").Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "master_link_status:up") {
				return fmt.Errorf("%s", info)
			}
			return nil
		})
	}
}

// Port is the server's port.
func (s *Server) Port() int { return s.port }

// URL is the server's redis:// URL for database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Kill stops the server with SIGKILL and waits until it has exited. Its data is lost,
// as on a crash. Killing a stopped server does nothing.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	_ = s.resumeLocked()
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
	return nil
}

// Restart starts the server again on the same port, empty, and waits until it answers.
func (s *Server) Restart() error {
	if err := s.Kill(); err != nil {
		return err
	}
	return s.start()
}

// Pause stops the process with SIGSTOP: connections stay open but nothing answers,
// as with a stalled or partitioned server. Resume undoes it.
func (s *Server) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("redis-server is not running")
	}
	return s.cmd.Process.Signal(syscall.SIGSTOP)
}

// Resume continues a paused server.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumeLocked()
}

func (s *Server) resumeLocked() error {
	if s.cmd == nil {
		return nil
	}
	return s.cmd.Process.Signal(syscall.SIGCONT)
}

// Running reports whether the process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

func (s *Server) start() error {
	bin, err := Binary()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var args []string
	if s.conf != "" {
		args = append(args, s.conf) // a config file comes first
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--port", fmt.Sprint(s.port),
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--protected-mode", "yes",
		"--loglevel", "warning",
		// A replica syncs at once rather than after five seconds.
		"--repl-diskless-sync-delay", "0",
	)
	args = append(args, s.args...)
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &testproc.Tail{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	// The server that answers must be this one: another may hold the port.
	for ping(s.Addr(), cmd.Process.Pid) != nil {
		select {
		case <-exited:
			if strings.Contains(out.String(), "Address already in use") {
				return fmt.Errorf("%w: %s", errPortTaken, out.String())
			}
			return fmt.Errorf("redis-server exited at start: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server did not answer on %s within 10s: %s", s.Addr(), out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.cmd, s.exited = cmd, exited
	return nil
}

// errPortTaken is a server that exited because its port was taken.
var errPortTaken = errors.New("its port was taken")

// ping asks the server at addr for its process id, in the inline protocol, and
// expects pid.
func ping(addr string, pid int) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	header, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(header, "$")))
	if !strings.HasPrefix(header, "$") || err != nil {
		return fmt.Errorf("unexpected reply %q", header)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	want := fmt.Sprintf("process_id:%d\r\n", pid)
	if !strings.Contains(string(body), want) {
		return fmt.Errorf("another server answers on %s", addr)
	}
	return nil
}

func mkdirTemp(t TB) string {
	dir, err := os.MkdirTemp("", "tokenwarden-redis-")
	if err != nil {
		t.Fatalf("redisserver: %v", err)
	}
	return dir
}

// CPUSeconds is the CPU time, user and system, that the Redis c talks to has spent
// since it started (INFO cpu): the difference over a run is Redis' own cost, which a
// loaded machine distorts far less than wall time.
func CPUSeconds(ctx context.Context, c redis.Cmdable) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, fmt.Errorf("INFO cpu: %s: %w", line, err)
				}
				sum += x
			}
		}
	}
	return sum, nil
}

// Commandstat reads, from INFO commandstats, how many times the server ran cmd (a
// lower-case command name: "evalsha") and its time in them in microseconds, since the
// server started or its statistics were reset.
func Commandstat(ctx context.Context, c redis.Cmdable, cmd string) (calls int64, usec float64, err error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, err = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, err = strconv.ParseFloat(v, 64)
			}
			if err != nil {
				return 0, 0, fmt.Errorf("INFO commandstats: %s: %w", line, err)
			}
		}
	}
	return calls, usec, nil
}
