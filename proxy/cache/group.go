// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// Errors a waiter reads.
var (
	// ErrLeaderFailed: the leader's upstream call failed before its first byte, or
	// answered other than 2xx. The waiter has read nothing; it joins again (Group.Join),
	// and the first to do so leads the next call while the others wait for it.
	ErrLeaderFailed = errors.New("cache: the leading request failed before its answer began")
	// ErrCut: the answer stopped before its end (the leader's upstream broke off), or
	// the waiter fell more than the group's buffer behind the leader and was cut off.
	ErrCut = errors.New("cache: the coalesced answer was cut")
)

// Group joins identical requests in flight (the same Key) to one upstream call: the
// first is the leader and makes the call; the others wait and read its answer as it
// arrives, a late joiner from the first byte.
//
// A call keeps its answer for its waiters up to maxBytes. Past that it takes no new
// joiners (the next identical request leads a call of its own) and keeps only what
// its slowest waiter has yet to read: a waiter that falls more than maxBytes behind
// the leader is cut off (it reads ErrCut), so that a slow client never slows the
// leader or the other waiters, nor holds more than maxBytes.
type Group struct {
	maxBytes int
	mu       sync.Mutex
	calls    map[[32]byte]*Call
}

// NewGroup is a group whose calls keep at most maxBytes of an answer.
func NewGroup(maxBytes int64) *Group {
	return &Group{maxBytes: int(min(maxBytes, 1<<31-1)), calls: make(map[[32]byte]*Call)}
}

// Join makes the request the leader of a new call for k, or a waiter of the call in
// flight. Exactly one of the results is set. A waiter's reads end when ctx does.
func (g *Group) Join(ctx context.Context, k Key) (*Call, *Waiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.calls[k.Hash]; c != nil {
		return nil, c.addWaiter(ctx)
	}
	c := &Call{g: g, key: k.Hash}
	g.calls[k.Hash] = c
	return c, nil
}

// InFlight is the number of calls in flight that take joiners.
func (g *Group) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.calls)
}

// detach takes c out of the group: no new request joins it.
func (g *Group) detach(c *Call) {
	g.mu.Lock()
	if g.calls[c.key] == c {
		delete(g.calls, c.key)
	}
	g.mu.Unlock()
}

// Call is one upstream call and its answer, written by the leader.
type Call struct {
	g   *Group
	key [32]byte

	mu sync.Mutex
	// changed is closed, and replaced, at every change a waiter may wait for; it is
	// made when a waiter first waits (a call without waiters costs none).
	changed     chan struct{}
	status      int
	contentType string
	// buf holds the answer from byte base on. shared: buf is a recorder's body
	// (Recorder.Share), which only the recorder appends to.
	buf      []byte
	shared   bool
	base     int
	detached bool
	// ended: Finish or Fail was called; complete: the answer reached its end.
	ended, complete, failed bool
	usage                   usage.Usage
	waiters                 map[*Waiter]struct{}
	// The upstream call's context (Context): parent's values and val under valKey.
	// leaderGone: the leader's client left; cancel ends the context; stop ends the
	// watch on parent.
	parent      context.Context
	valKey, val any
	leaderGone  bool
	cancel      context.CancelFunc
	stop        func() bool
}

func (c *Call) addWaiter(ctx context.Context) *Waiter {
	w := &Waiter{c: c, ctx: ctx}
	c.mu.Lock()
	if c.waiters == nil {
		c.waiters = make(map[*Waiter]struct{})
	}
	c.waiters[w] = struct{}{}
	c.mu.Unlock()
	return w
}

// broadcastLocked wakes every waiter. Without one nothing waits: a waiter that joins
// later reads the state before it waits.
func (c *Call) broadcastLocked() {
	if c.changed == nil {
		return
	}
	close(c.changed)
	c.changed = nil
}

// changedLocked is the channel closed at the call's next change.
func (c *Call) changedLocked() chan struct{} {
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	return c.changed
}

// Context is the context for the leader's upstream call: it has parent's values and
// val under key, and it ends when the leader's client leaves (parent ends) only if no
// waiter is left, or later when the last waiter leaves, so a leader whose client
// leaves does not abandon its waiters. Once the call has ended (Finish, Fail), it
// ends when the leader's client leaves. The leader calls Release as its request ends.
//
// It is one context (the caller's value rides in it rather than in a context of its
// own on top), made with context.WithCancel on the call's detached view of parent: the
// contexts the transport makes below it find it as the context package's own and
// register with it, where a context of another type would cost each of them a
// goroutine. A parent that is never cancelled is not watched.
func (c *Call) Context(parent context.Context, key, val any) context.Context {
	c.parent, c.valKey, c.val = parent, key, val
	ctx, cancel := context.WithCancel((*detached)(c))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancel = cancel
	if parent.Done() != nil {
		c.stop = context.AfterFunc(parent, c.leaderLeft)
	}
	return ctx
}

// leaderLeft runs when the leader's client has left: the upstream call ends now
// unless a waiter still reads it.
func (c *Call) leaderLeft() {
	c.mu.Lock()
	c.leaderGone = true
	idle := len(c.waiters) == 0
	cancel := c.cancel
	c.mu.Unlock()
	if idle {
		cancel()
	}
}

// detached is a call's view of its leader's context: its values, and the caller's,
// never its end (as context.WithoutCancel, with no allocation of its own).
type detached Call

func (*detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detached) Done() <-chan struct{}       { return nil }
func (*detached) Err() error                  { return nil }

// Value is val under the call's key, or the leader's context's value.
func (d *detached) Value(key any) any {
	if key == d.valKey {
		return d.val
	}
	return d.parent.Value(key)
}

func (*detached) String() string { return "cache.Call.detached" }

// Waiters is the number of waiters reading the call.
func (c *Call) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// Head publishes the answer's status and Content-Type: a waiter gets no other header
// of the leader's. An answer other than 2xx is not shared: the call ends as by Fail,
// and the leader serves its own answer alone.
func (c *Call) Head(status int, header http.Header) {
	if status < 200 || status > 299 {
		c.Fail()
		return
	}
	c.mu.Lock()
	c.status, c.contentType = status, headerFirst(header, "Content-Type")
	c.broadcastLocked()
	c.mu.Unlock()
}

// Write appends bytes of the answer for the waiters; it never fails and never waits
// for a waiter.
func (c *Call) Write(p []byte) (int, error) {
	c.mu.Lock()
	over := !c.detached && len(c.buf)+len(p) > c.g.maxBytes
	c.mu.Unlock()
	if over {
		c.g.detach(c)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return len(p), nil
	}
	c.detached = c.detached || over
	if c.shared {
		// The recorder dropped its body: the call keeps its own copy from here on.
		c.buf, c.shared = append([]byte(nil), c.buf...), false
	}
	c.buf = append(c.buf, p...)
	if c.detached {
		c.trimLocked()
	}
	c.broadcastLocked()
	return len(p), nil
}

// publish makes b, the answer so far, the call's: b is a recorder's body, which only
// grows, so the waiters read the one copy the store will keep.
func (c *Call) publish(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return
	}
	c.buf, c.shared = b, true
	c.broadcastLocked()
}

// trimLocked cuts off the waiters more than maxBytes behind and drops what every
// remaining waiter has read.
func (c *Call) trimLocked() {
	end := c.base + len(c.buf)
	low := end
	for w := range c.waiters {
		if end-w.off > c.g.maxBytes {
			w.cut = true
			delete(c.waiters, w)
			continue
		}
		low = min(low, w.off)
	}
	if drop := low - c.base; drop > 0 {
		n := copy(c.buf, c.buf[drop:])
		c.buf = c.buf[:n]
		c.base = low
	}
	if len(c.waiters) == 0 && c.leaderGone && c.cancel != nil {
		c.cancel()
	}
}

// Finish ends the answer: complete when it reached its end (the waiters read io.EOF
// after the last byte), cut otherwise (they read ErrCut). u is the leader's usage,
// which the waiters replay.
func (c *Call) Finish(complete bool, u usage.Usage) {
	c.g.detach(c)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return
	}
	c.ended, c.complete, c.usage = true, complete, u
	c.endLocked()
}

// Fail ends a call whose upstream failed before the first byte: every waiter reads
// ErrLeaderFailed and joins again.
func (c *Call) Fail() {
	c.g.detach(c)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return
	}
	c.ended, c.failed = true, true
	c.endLocked()
}

// endLocked wakes the waiters to the end. The upstream context is left as it is: the
// leader may still be reading an answer of its own (an error, a coding the proxy
// cannot read), which ends with its client from here on, as any request's.
func (c *Call) endLocked() {
	c.broadcastLocked()
}

// Release ends the leader's part: its request has ended, so its context is no longer
// watched. The upstream context is not cancelled, as its call is over (nothing
// below it waits on it).
func (c *Call) Release() {
	c.mu.Lock()
	stop := c.stop
	c.stop = nil
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Waiter reads a call's answer; it is an io.Reader of the body.
type Waiter struct {
	c   *Call
	ctx context.Context
	// off is the next byte to read; cut: the waiter fell too far behind.
	off  int
	cut  bool
	left bool
}

// Head waits for the answer's status and Content-Type. It returns ErrLeaderFailed
// when the leader's call failed before them, and the context's error when it ends
// first.
func (w *Waiter) Head() (int, string, error) {
	c := w.c
	for {
		c.mu.Lock()
		switch {
		case c.status != 0:
			s, ct := c.status, c.contentType
			c.mu.Unlock()
			return s, ct, nil
		case c.failed || (c.ended && c.status == 0):
			c.mu.Unlock()
			return 0, "", ErrLeaderFailed
		}
		ch := c.changedLocked()
		c.mu.Unlock()
		select {
		case <-ch:
		case <-w.ctx.Done():
			return 0, "", w.ctx.Err()
		}
	}
}

// Read implements io.Reader: the answer's bytes as they arrive, io.EOF after the end
// of a complete answer, ErrCut for one that stopped early, the context's error when
// it ends first.
func (w *Waiter) Read(p []byte) (int, error) {
	c := w.c
	for {
		c.mu.Lock()
		if w.cut {
			c.mu.Unlock()
			return 0, ErrCut
		}
		if avail := c.base + len(c.buf) - w.off; avail > 0 {
			n := copy(p, c.buf[w.off-c.base:])
			w.off += n
			c.mu.Unlock()
			return n, nil
		}
		if c.ended {
			complete := c.complete
			c.mu.Unlock()
			if complete {
				return 0, io.EOF
			}
			return 0, ErrCut
		}
		ch := c.changedLocked()
		c.mu.Unlock()
		select {
		case <-ch:
		case <-w.ctx.Done():
			return 0, w.ctx.Err()
		}
	}
}

// Usage is the leader's usage, once the answer is complete: what the waiter saved.
func (w *Waiter) Usage() usage.Usage {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return w.c.usage
}

// Leave ends the waiter; every waiter leaves once, whether it read the whole answer
// or its client went away. The last waiter to leave a call whose leader's client has
// gone ends the upstream call.
func (w *Waiter) Leave() {
	c := w.c
	c.mu.Lock()
	if w.left {
		c.mu.Unlock()
		return
	}
	w.left = true
	delete(c.waiters, w)
	idle := len(c.waiters) == 0 && c.leaderGone && !c.ended
	cancel := c.cancel
	if c.detached && !c.ended {
		c.trimLocked() // what only this waiter had yet to read is dropped
	}
	c.mu.Unlock()
	if idle && cancel != nil {
		cancel()
	}
}
