// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
)

// credential reads the client's key from Authorization: Bearer or x-api-key.
func credential(r *http.Request) (string, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			return strings.TrimSpace(h[7:]), true
		}
		return strings.TrimSpace(h), true
	}
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return strings.TrimSpace(k), true
	}
	return "", false
}

// decodedBody is a charged request's body as the upstream will read it: a gzip or
// deflate body is decoded (bounded by max_body_bytes) for the estimate, so compression
// is no way around it; one in a coding the proxy cannot read is refused with 415, as it
// could not be estimated. It answers the refusal itself and reports false when the request must
// stop.
func (ex *exchange) decodedBody(body []byte, maxBytes int64) ([]byte, bool) {
	codings, ok := contentCodings(ex.r.Header)
	if !ok {
		return nil, ex.fail(http.StatusUnsupportedMediaType, "invalid_request",
			"the request body's Content-Encoding is not one the proxy reads: send it plain, gzip or deflate", nil)
	}
	if len(codings) == 0 {
		return body, true
	}
	decoded, err := decodeRequest(body, codings, maxBytes)
	switch {
	case errors.Is(err, errDecodedTooLarge):
		return nil, ex.tooLarge(maxBytes)
	case err != nil:
		return nil, ex.fail(http.StatusBadRequest, "invalid_request", "the request body could not be decoded: "+err.Error(), nil)
	}
	return decoded, true
}

// readAll reads the whole body, at most max bytes, and replaces r.Body with a replay
// of it. It answers 413 or 400 itself and reports false when the request must stop.
func (ex *exchange) readAll(maxBytes int64) ([]byte, bool) {
	r := ex.r
	if r.ContentLength > maxBytes {
		return nil, ex.tooLarge(maxBytes)
	}
	body, err := readAtMost(r.Body, r.ContentLength, maxBytes+1)
	if int64(len(body)) > maxBytes {
		return nil, ex.tooLarge(maxBytes)
	}
	if err != nil {
		return nil, ex.fail(http.StatusBadRequest, "invalid_request", "the request body could not be read", nil)
	}
	rb := &replayBody{body: body}
	rb.Reset(body)
	r.Body = rb
	r.ContentLength = int64(len(body))
	r.GetBody = rb.again
	return body, true
}

// readAtMost reads src to its end or to limit bytes, whichever comes first, into one
// buffer sized by the declared length when there is one (plus a byte, to see the end
// without growing). It returns what it read and the error that ended the read, nil at
// the end of src.
func readAtMost(src io.Reader, declared, limit int64) ([]byte, error) {
	size := int64(512)
	if declared > 0 {
		size = declared + 1
	}
	buf := make([]byte, 0, min(size, limit))
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(int64(cap(buf)), limit-int64(len(buf)))))
		}
		room := buf[len(buf):min(int64(cap(buf)), limit)]
		n, err := src.Read(room)
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// replayBody is a request body read once and sent from memory, as often as the
// transport asks (GetBody).
type replayBody struct {
	bytes.Reader
	body []byte
}

// Close implements io.Closer; there is nothing to close.
func (*replayBody) Close() error { return nil }

// again is the body from its start, for the transport's GetBody.
func (rb *replayBody) again() (io.ReadCloser, error) {
	next := &replayBody{body: rb.body}
	next.Reset(rb.body)
	return next, nil
}
