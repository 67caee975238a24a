// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// Entry is one stored answer: a complete 2xx response as the client received it,
// decoded (it is replayed without a Content-Encoding), with only its Content-Type:
// never the upstream's request id, rate-limit values or cookies, which were another
// caller's.
type Entry struct {
	// Status is the upstream's 2xx status.
	Status int
	// ContentType is the response's Content-Type.
	ContentType string
	// Body is the whole decoded body; for a stream, its events one after another.
	Body []byte
	// Events, for a stream, are where each event ends in Body: a replay writes and
	// flushes them one at a time, as they arrived. Nil for a body that is not a stream.
	Events []int32
	// Usage is the stored answer's usage: what a hit saves.
	Usage usage.Usage
	// Stored is when the answer was stored, on the injected clock.
	Stored time.Time
}

// Stream reports whether the entry is an event stream.
func (e *Entry) Stream() bool { return e.Events != nil }

// Size is what the entry holds in memory, in bytes, as the memory store counts it.
func (e *Entry) Size() int64 {
	const overhead = 96 // the struct
	return int64(overhead + len(e.ContentType) + len(e.Body) + 4*len(e.Events))
}

// Age is how long ago the entry was stored, in whole seconds (the Age header).
func (e *Entry) Age(now time.Time) int64 { return max(int64(now.Sub(e.Stored)/time.Second), 0) }

// EachEvent calls fn with each event of a stream in order, or once with the whole
// body of an answer that is not one.
func (e *Entry) EachEvent(fn func([]byte) error) error {
	if e.Events == nil {
		return fn(e.Body)
	}
	start := 0
	for _, end := range e.Events {
		if err := fn(e.Body[start:end]); err != nil {
			return err
		}
		start = int(end)
	}
	if start < len(e.Body) {
		return fn(e.Body[start:])
	}
	return nil
}

// entryVersion is the first byte of an encoded entry; a store reads an entry of
// another version as a miss.
const entryVersion = 1

// errBadEntry is an encoded entry that does not decode.
var errBadEntry = errors.New("cache: malformed entry")

// encode writes the entry as the Redis store keeps it.
func (e *Entry) encode() []byte {
	b := make([]byte, 0, 64+len(e.ContentType)+len(e.Body)+5*len(e.Events))
	b = append(b, entryVersion)
	b = binary.AppendUvarint(b, uint64(e.Status))
	b = binary.AppendVarint(b, e.Stored.UnixNano())
	b = binary.AppendVarint(b, e.Usage.Input)
	b = binary.AppendVarint(b, e.Usage.Output)
	b = binary.AppendVarint(b, e.Usage.Cached)
	found := uint64(0)
	if e.Usage.Found {
		found = 1
	}
	b = binary.AppendUvarint(b, found)
	b = binary.AppendUvarint(b, uint64(len(e.ContentType)))
	b = append(b, e.ContentType...)
	if e.Events == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(e.Events))+1)
		for _, end := range e.Events {
			b = binary.AppendUvarint(b, uint64(end))
		}
	}
	return append(b, e.Body...)
}

// decodeEntry reads what encode wrote.
func decodeEntry(b []byte) (*Entry, error) {
	d := decoder{b: b}
	if v := d.byte(); v != entryVersion {
		return nil, fmt.Errorf("%w: version %d", errBadEntry, v)
	}
	e := &Entry{Status: int(d.uvarint())}
	e.Stored = time.Unix(0, d.varint())
	e.Usage.Input, e.Usage.Output, e.Usage.Cached = d.varint(), d.varint(), d.varint()
	e.Usage.Found = d.uvarint() == 1
	e.ContentType = d.str()
	if n := d.uvarint(); n > 0 && d.err == nil {
		if n-1 > uint64(len(d.b)) {
			return nil, errBadEntry
		}
		e.Events = make([]int32, n-1)
		for i := range e.Events {
			e.Events[i] = int32(d.uvarint())
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	e.Body = d.b
	prev := int32(0)
	for _, end := range e.Events {
		if end < prev || int(end) > len(e.Body) {
			return nil, fmt.Errorf("%w: event ends at %d of %d", errBadEntry, end, len(e.Body))
		}
		prev = end
	}
	if e.Status < 200 || e.Status > 299 {
		return nil, fmt.Errorf("%w: status %d", errBadEntry, e.Status)
	}
	return e, nil
}

// decoder reads an encoded entry; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.err = errBadEntry
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errBadEntry
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errBadEntry
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errBadEntry
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
