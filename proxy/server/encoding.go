// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/tokenwarden/tokenwarden/proxy/upstream"
)

// A compressed response reaches the client as the upstream sent it; a decoder beside
// the copy decompresses it for the usage reader. Only the encodings it can decode are
// offered upstream.

// offerEncodings keeps, of the client's Accept-Encoding, only gzip, deflate and
// identity (br, zstd and the rest are removed); when nothing is left it asks for
// identity. A request without Accept-Encoding is left to the transport, which asks
// for gzip and decodes the answer itself.
func offerEncodings(h http.Header) {
	vals := h.Values("Accept-Encoding")
	if len(vals) == 0 {
		return
	}
	clean := true
	for _, v := range vals {
		for part := range strings.SplitSeq(v, ",") {
			if !decodable(part) {
				clean = false
			}
		}
	}
	if clean {
		return
	}
	var kept []string
	for _, v := range vals {
		for part := range strings.SplitSeq(v, ",") {
			if decodable(part) {
				kept = append(kept, strings.TrimSpace(part))
			}
		}
	}
	if len(kept) == 0 {
		h.Set("Accept-Encoding", "identity")
		return
	}
	h.Set("Accept-Encoding", strings.Join(kept, ", "))
}

// decodable reports whether an Accept-Encoding element (a coding with optional
// parameters) names a coding the proxy can decode; an empty element is harmless.
func decodable(part string) bool {
	name, _, _ := strings.Cut(part, ";")
	switch name = strings.TrimSpace(name); {
	case name == "",
		strings.EqualFold(name, "gzip"), strings.EqualFold(name, "x-gzip"),
		strings.EqualFold(name, "deflate"), strings.EqualFold(name, "identity"):
		return true
	}
	return false
}

// contentCodings returns the codings of a response body, in the order they were
// applied; ok is false when one of them is a coding the proxy cannot decode.
func contentCodings(h http.Header) (codings []string, ok bool) {
	vals := h.Values("Content-Encoding")
	if len(vals) == 0 {
		return nil, true
	}
	for _, v := range vals {
		for part := range strings.SplitSeq(v, ",") {
			switch name := strings.TrimSpace(part); {
			case name == "", strings.EqualFold(name, "identity"):
			case strings.EqualFold(name, "gzip"), strings.EqualFold(name, "x-gzip"):
				codings = append(codings, "gzip")
			case strings.EqualFold(name, "deflate"):
				codings = append(codings, "deflate")
			default:
				return nil, false
			}
		}
	}
	return codings, true
}

// errCut tells the decoder that the body stopped before its end.
var errCut = errors.New("the response body was cut")

// errDecoded tells a late write that the decoder has finished.
var errDecoded = errors.New("the response body is decoded")

// decoder decompresses a compressed body for the usage reader; the client gets the
// bytes as the upstream sent them. A body that fits one copy buffer (most answers
// that are not streams) is held compressed and decoded when it ends, on the caller's
// goroutine. A longer one is decoded as it passes, on a goroutine of its own fed by a
// pipe: a write returns once the decoder has taken the bytes, so the decoder never
// holds more than its window, and a decoder that has stopped (the end of its data,
// or an error) makes every later write return at once.
type decoder struct {
	codings []string
	dst     io.Writer
	// held is the compressed body so far, in a buffer lent by upstream.Buffers, until it
	// outgrows the buffer.
	held []byte
	pw   *io.PipeWriter
	done chan struct{}
	// err is the decoder goroutine's error, read after done is closed.
	err error
}

func newDecoder(codings []string, dst io.Writer) *decoder {
	return &decoder{codings: codings, dst: dst, held: upstream.Buffers.Get()[:0]}
}

// write passes the next bytes of the body to the decoder.
func (d *decoder) write(p []byte) {
	if d.pw == nil {
		if len(d.held)+len(p) <= cap(d.held) {
			d.held = append(d.held, p...)
			return
		}
		pr, pw := io.Pipe()
		d.pw, d.done = pw, make(chan struct{})
		go func() {
			defer close(d.done)
			d.err = decode(pr, d.codings, d.dst)
			pr.CloseWithError(errDecoded)
		}()
		_, _ = d.pw.Write(d.held)
		d.giveBack()
	}
	_, _ = d.pw.Write(p)
}

func (d *decoder) giveBack() {
	if d.held != nil {
		upstream.Buffers.Put(d.held[:cap(d.held)])
		d.held = nil
	}
}

// close ends the decoder's input (at the body's end, or cut) and returns once every
// byte it got is decoded, with the decoder's error, if any.
func (d *decoder) close(eof bool) error {
	if d.pw == nil {
		err := decode(bytes.NewReader(d.held), d.codings, d.dst)
		d.giveBack()
		return err
	}
	if eof {
		_ = d.pw.Close()
	} else {
		_ = d.pw.CloseWithError(errCut)
	}
	<-d.done
	return d.err
}

// decode decodes r, compressed with codings in that order, into dst. An empty body
// decodes to nothing.
func decode(r io.Reader, codings []string, dst io.Writer) error {
	var err error
	var used []pooled
	for i := len(codings) - 1; i >= 0 && err == nil; i-- {
		var p pooled
		if p, err = decodingReader(codings[i], r); p.r != nil {
			r = p.r
			used = append(used, p)
		}
	}
	if err == nil {
		buf := upstream.Buffers.Get()
		_, err = io.CopyBuffer(dst, r, buf)
		upstream.Buffers.Put(buf)
	}
	for _, p := range used {
		p.pool.Put(p.r)
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// Decompressors hold tens of kilobytes of state: they are reused.
var (
	gzipReaders  sync.Pool
	zlibReaders  sync.Pool
	flateReaders sync.Pool
)

// pooled is a decompressor and the pool it goes back to.
type pooled struct {
	r    io.Reader
	pool *sync.Pool
}

// decodingReader decodes one coding. HTTP's deflate is zlib (RFC 9110), but some
// servers send raw deflate: the first two bytes tell which.
func decodingReader(coding string, r io.Reader) (pooled, error) {
	if coding == "gzip" {
		if zr, ok := gzipReaders.Get().(*gzip.Reader); ok {
			if err := zr.Reset(r); err != nil {
				gzipReaders.Put(zr)
				return pooled{}, err
			}
			return pooled{zr, &gzipReaders}, nil
		}
		zr, err := gzip.NewReader(r)
		if err != nil {
			return pooled{}, err
		}
		return pooled{zr, &gzipReaders}, nil
	}
	br := bufio.NewReader(r)
	head, err := br.Peek(2)
	if err != nil {
		return pooled{}, err
	}
	if head[0]&0x0f == 8 && (uint16(head[0])<<8|uint16(head[1]))%31 == 0 {
		if zr, ok := zlibReaders.Get().(io.Reader); ok {
			if err := zr.(zlib.Resetter).Reset(br, nil); err != nil {
				zlibReaders.Put(zr)
				return pooled{}, err
			}
			return pooled{zr, &zlibReaders}, nil
		}
		zr, err := zlib.NewReader(br)
		if err != nil {
			return pooled{}, err
		}
		return pooled{zr, &zlibReaders}, nil
	}
	if fr, ok := flateReaders.Get().(io.Reader); ok {
		if err := fr.(flate.Resetter).Reset(br, nil); err != nil {
			return pooled{}, err
		}
		return pooled{fr, &flateReaders}, nil
	}
	return pooled{flate.NewReader(br), &flateReaders}, nil
}

// errDecodedTooLarge is a compressed request body that decodes past max_body_bytes.
var errDecodedTooLarge = errors.New("the request body decodes to more than max_body_bytes")

// decodeRequest decodes a compressed request body so that admission estimates what
// the upstream will read, not its compressed bytes; the upstream still gets the body as
// the client sent it. The decoded body is bounded by maxBytes like any other body.
func decodeRequest(body []byte, codings []string, maxBytes int64) ([]byte, error) {
	w := &boundedBuffer{max: maxBytes}
	if err := decode(bytes.NewReader(body), codings, w); err != nil {
		return nil, err
	}
	return w.b, nil
}

// boundedBuffer collects at most max bytes and fails past them.
type boundedBuffer struct {
	b   []byte
	max int64
}

func (w *boundedBuffer) Write(p []byte) (int, error) {
	if int64(len(w.b)+len(p)) > w.max {
		return 0, errDecodedTooLarge
	}
	w.b = append(w.b, p...)
	return len(p), nil
}
