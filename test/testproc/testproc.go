// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package testproc holds what the test servers (Redis, PostgreSQL, the stack's
// processes) share: a free loopback port and the tail of a process's output.
package testproc

import (
	"net"
	"strings"
	"sync"
)

// FreePort returns a loopback TCP port that nothing listened on a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Tail keeps the last 4 KiB of a process's output for error messages.
type Tail struct {
	mu  sync.Mutex
	buf []byte
}

// Write implements io.Writer.
func (b *Tail) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 4096 {
		b.buf = b.buf[len(b.buf)-4096:]
	}
	return len(p), nil
}

// Reset forgets what was kept.
func (b *Tail) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = nil
}

// String is what was kept, trimmed.
func (b *Tail) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(string(b.buf))
}
