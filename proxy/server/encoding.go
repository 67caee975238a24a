// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"strings"
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

// decoder decompresses a body on its own goroutine: the bytes the client gets are
// written to a pipe, and the decompressed bytes go to the usage reader. A write
// returns once the decoder has taken the bytes, so the decoder never holds more than
// its window, and a decoder that has stopped (the end of its data, or an error) makes
// every later write return at once.
type decoder struct {
	pw   *io.PipeWriter
	done chan struct{}
	// err is the decoder's error, read after done is closed.
	err error
}

func startDecoder(codings []string, dst io.Writer) *decoder {
	pr, pw := io.Pipe()
	d := &decoder{pw: pw, done: make(chan struct{})}
	go d.run(pr, codings, dst)
	return d
}

func (d *decoder) run(pr *io.PipeReader, codings []string, dst io.Writer) {
	defer close(d.done)
	var r io.Reader = pr
	var err error
	for i := len(codings) - 1; i >= 0 && err == nil; i-- {
		r, err = decodingReader(codings[i], r)
	}
	if err == nil {
		buf := copyBuffers.Get()
		_, err = io.CopyBuffer(dst, r, buf)
		copyBuffers.Put(buf)
	}
	if errors.Is(err, io.EOF) {
		// An empty body: nothing to decode.
		err = nil
	}
	d.err = err
	pr.CloseWithError(errDecoded)
}

// decodingReader decodes one coding. HTTP's deflate is zlib (RFC 9110), but some
// servers send raw deflate: the first two bytes tell which.
func decodingReader(coding string, r io.Reader) (io.Reader, error) {
	if coding == "gzip" {
		return gzip.NewReader(r)
	}
	br := bufio.NewReader(r)
	head, err := br.Peek(2)
	if err != nil {
		return nil, err
	}
	if head[0]&0x0f == 8 && (uint16(head[0])<<8|uint16(head[1]))%31 == 0 {
		return zlib.NewReader(br)
	}
	return flate.NewReader(br), nil
}

// write passes the next bytes of the body to the decoder.
func (d *decoder) write(p []byte) { _, _ = d.pw.Write(p) }

// close ends the decoder's input (at the body's end, or cut) and waits for it to
// finish; it returns the decoder's error, if any.
func (d *decoder) close(eof bool) error {
	if eof {
		_ = d.pw.Close()
	} else {
		_ = d.pw.CloseWithError(errCut)
	}
	<-d.done
	return d.err
}
