// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadAtMost: a body is read whole whatever length it declares and however its
// reader splits it, never past the limit, and a read error is reported.
func TestReadAtMost(t *testing.T) {
	body := strings.Repeat("0123456789", 100) // 1,000 bytes
	for _, c := range []struct {
		name            string
		src             io.Reader
		declared, limit int64
		want            int
	}{
		{"declared", strings.NewReader(body), 1000, 2000, 1000},
		{"undeclared", strings.NewReader(body), -1, 2000, 1000},
		{"declared short", strings.NewReader(body), 10, 2000, 1000},
		{"declared long", strings.NewReader(body), 5000, 2000, 1000},
		{"a byte at a time", iotest.OneByteReader(strings.NewReader(body)), -1, 2000, 1000},
		{"at the limit", strings.NewReader(body), 1000, 1000, 1000},
		{"over the limit", strings.NewReader(body), -1, 999, 999},
		{"over the limit, declared", strings.NewReader(body), 1000, 101, 101},
		{"empty", strings.NewReader(""), 0, 2000, 0},
	} {
		got, err := readAtMost(c.src, c.declared, c.limit)
		if err != nil || len(got) != c.want || !bytes.Equal(got, []byte(body[:c.want])) {
			t.Errorf("%s: read %d bytes (err %v), want the first %d", c.name, len(got), err, c.want)
		}
	}
	broken := errors.New("connection reset")
	if _, err := readAtMost(io.MultiReader(strings.NewReader(body), iotest.ErrReader(broken)), 2000, 4000); !errors.Is(err, broken) {
		t.Errorf("a failed read reports %v, want %v", err, broken)
	}
}

// TestReplayBodyAgain: the transport's GetBody gives the whole body again, however
// much of the first was read.
func TestReplayBodyAgain(t *testing.T) {
	rb := &replayBody{body: []byte("hello")}
	rb.Reset(rb.body)
	if _, err := io.ReadAll(rb); err != nil {
		t.Fatal(err)
	}
	again, _ := rb.again()
	if b, _ := io.ReadAll(again); string(b) != "hello" {
		t.Errorf("GetBody gave %q, want %q", b, "hello")
	}
}
