// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestOfferEncodings(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want []string
	}{
		{nil, nil},
		{[]string{"gzip, deflate"}, []string{"gzip, deflate"}},
		{[]string{"gzip, deflate, br, zstd"}, []string{"gzip, deflate"}},
		{[]string{"br;q=1.0, GZIP;q=0.8", "x-gzip"}, []string{"GZIP;q=0.8, x-gzip"}},
		{[]string{"br"}, []string{"identity"}},
		{[]string{"*"}, []string{"identity"}},
		{[]string{"identity;q=1, *;q=0"}, []string{"identity;q=1"}},
	} {
		h := http.Header{}
		for _, v := range c.in {
			h.Add("Accept-Encoding", v)
		}
		offerEncodings(h)
		if got := h.Values("Accept-Encoding"); !slices.Equal(got, c.want) {
			t.Errorf("%q: offered %q, want %q", c.in, got, c.want)
		}
	}
}

func TestContentCodings(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want []string
		ok   bool
	}{
		{nil, nil, true},
		{[]string{"identity"}, nil, true},
		{[]string{"GZIP"}, []string{"gzip"}, true},
		{[]string{"x-gzip"}, []string{"gzip"}, true},
		{[]string{"deflate, gzip"}, []string{"deflate", "gzip"}, true},
		{[]string{"gzip", "br"}, nil, false},
		{[]string{"zstd"}, nil, false},
		{[]string{"compress"}, nil, false},
	} {
		h := http.Header{}
		for _, v := range c.in {
			h.Add("Content-Encoding", v)
		}
		got, ok := contentCodings(h)
		if ok != c.ok || !slices.Equal(got, c.want) {
			t.Errorf("%q: codings %q %v, want %q %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// compressed is data compressed with a coding, written in pieces with flushes, as a
// stream would be.
func compressed(t *testing.T, coding string, data []byte) []byte {
	var b bytes.Buffer
	var w interface {
		io.Writer
		Flush() error
		Close() error
	}
	switch coding {
	case "gzip":
		w = gzip.NewWriter(&b)
	case "deflate":
		w = zlib.NewWriter(&b)
	case "deflate-raw":
		w, _ = flate.NewWriter(&b, flate.BestSpeed)
	}
	for len(data) > 0 {
		n := min(1000, len(data))
		_, _ = w.Write(data[:n])
		_ = w.Flush()
		data = data[n:]
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestDecoder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 100, 20 << 10, 1 << 20} {
		// Random bytes do not compress: the 1 MiB body outgrows the held buffer.
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.IntN(256))
		}
		for _, coding := range []string{"gzip", "deflate", "deflate-raw"} {
			body := compressed(t, coding, data)
			name := strings.TrimSuffix(coding, "-raw")
			feed := func(d *decoder, b []byte) {
				for len(b) > 0 {
					n := min(4096, len(b))
					d.write(b[:n])
					b = b[n:]
				}
			}

			var whole bytes.Buffer
			d := newDecoder([]string{name}, &whole)
			feed(d, body)
			if err := d.close(true); err != nil || !bytes.Equal(whole.Bytes(), data) {
				t.Errorf("%s of %d bytes: decoded %d bytes, error %v", coding, size, whole.Len(), err)
			}

			if size == 0 {
				continue
			}
			var cut bytes.Buffer
			d = newDecoder([]string{name}, &cut)
			feed(d, body[:len(body)/2])
			_ = d.close(false)
			if cut.Len() == 0 || !bytes.HasPrefix(data, cut.Bytes()) {
				t.Errorf("%s of %d bytes cut in half: decoded %d bytes, not a prefix of the body", coding, size, cut.Len())
			}

			var corrupt bytes.Buffer
			d = newDecoder([]string{name}, &corrupt)
			bad := slices.Clone(body)
			for i := len(bad) / 3; i < len(bad)/3+64 && i < len(bad); i++ {
				bad[i] ^= 0x5a
			}
			feed(d, bad)
			if err := d.close(true); err == nil && bytes.Equal(corrupt.Bytes(), data) {
				t.Errorf("%s of %d bytes corrupted: decoded without an error", coding, size)
			}
		}
	}
}
