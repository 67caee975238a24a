// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"errors"
	"io"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/cache"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/refusal"
	"github.com/tokenwarden/tokenwarden/proxy/upstream"
	"github.com/tokenwarden/tokenwarden/proxy/usage"
)

// cacheHeader says how the response cache answered: hit, miss, coalesced or bypass.
const cacheHeader = "X-Tokenwarden-Cache"

// maxRejoins bounds how often a waiter joins again after its leader failed before
// its answer began; past it the request goes to the upstream alone.
const maxRejoins = 4

// cacheRoom is the response cache in force: the config it was built from, its store
// (nil: answers are not kept) and its coalescing group (nil: none). It is kept across
// reloads that leave the cache's config as it was.
type cacheRoom struct {
	cfg   config.Cache
	store cache.Store
	group *cache.Group
	close func() error
	// scopes are the scope strings of the keys or teams seen (scopeFor), at most
	// maxScopeStrings of them.
	scopes     sync.Map
	scopeCount atomic.Int64
}

// maxScopeStrings bounds the scope strings a cache keeps; past it they are built.
const maxScopeStrings = 1 << 14

// cacheState is a request's part in the cache: its key, the stored answer found for
// it, whether its answer may be stored, the recorder of that answer (recording: in
// use), the call it leads (call, until the call ends; led, until the request does),
// what it will be (outcome) and what it was (result, set once admitted).
type cacheState struct {
	room      *cacheRoom
	key       cache.Key
	keyed     bool
	hit       *cache.Entry
	store     bool
	recording bool
	rec       cache.Recorder
	call      *cache.Call
	led       *cache.Call
	outcome   string
	result    string
	// header is the cache header's value: the request's own, so that setting it costs
	// no allocation.
	header [1]string
}

// setHeader sets the cache header to v, before the answer's head is written.
func (cs *cacheState) setHeader(h http.Header, v string) {
	cs.header[0] = v
	h[cacheHeader] = cs.header[:1:1]
}

// bindCache builds the response cache the config asks for, or keeps the one in force
// when its config is unchanged. It runs under applyMu.
func (s *Server) bindCache(cfg *config.Config) {
	prev := s.cache.Load()
	if prev != nil && reflect.DeepEqual(prev.cfg, cfg.Cache) {
		return
	}
	var room *cacheRoom
	if c := cfg.Cache; c.Enabled() {
		room = &cacheRoom{cfg: c}
		switch c.Storage {
		case config.CacheMemoryStorage:
			room.store = cache.NewMemory(s.clock, c.TTL(), c.StoreBytes())
		case config.CacheRedisStorage:
			client, err := cache.NewRedisClient(c.Redis.URL, os.Getenv(c.Redis.PasswordEnv), c.Redis.Timeout())
			if err != nil {
				// Validated already; a cache that cannot be built is a cache of misses.
				s.log.Error("The response cache's Redis cannot be used; every lookup misses", "error", err)
				break
			}
			room.store = cache.NewRedis(cache.RedisOptions{Client: client, Clock: s.clock, TTL: c.TTL(), Timeout: c.Redis.Timeout(), Log: s.log})
			room.close = client.Close
		}
		if c.Coalesces() {
			room.group = cache.NewGroup(c.EntryBytes())
		}
	}
	s.cache.Store(room)
	if room != nil && room.store != nil {
		st := room.store
		s.metrics.Cache.SetSource(func() metrics.CacheStats {
			x := st.Stats()
			return metrics.CacheStats{Entries: x.Entries, Bytes: x.Bytes, Evictions: x.Evictions, Errors: x.Errors}
		})
	} else {
		s.metrics.Cache.SetSource(nil)
	}
	if prev != nil && prev.close != nil {
		_ = prev.close()
	}
}

// cachePeek keys a request on its body as forwarded and finds its fresh stored
// answer, if any, before the limits for agents: a hit holds no slot in flight. What
// it found is served only once the request is admitted (cacheLookup).
func (s *Server) cachePeek(ex *exchange) (hit bool) {
	room := s.cache.Load()
	if room == nil || !ex.route.charged || ex.body == nil {
		return false
	}
	cs := &ex.cache
	cs.room, cs.outcome = room, metrics.CacheBypass
	var name, team string
	if ex.key != nil {
		name, team = ex.key.Name, ex.key.Team
	}
	scope, ok := room.scopeFor(name, team)
	d := cache.RequestDirectives(ex.r.Header)
	if !ok || !room.cfg.Serves(ex.route.name, ex.est.Model, name) || !d.Store() || cache.Stateful(ex.route.name, ex.est.State) {
		return false
	}
	body := ex.body
	if ex.try.Body != nil {
		body = ex.try.Body
	}
	cs.key = (&cache.Request{
		Scope: scope, Route: ex.route.name, Upstream: ex.upstream.Name, Model: ex.est.Model,
		Query: ex.r.URL.RawQuery, Header: ex.r.Header, Body: body,
	}).Key()
	cs.keyed, cs.store, cs.outcome = true, room.store != nil, metrics.CacheMiss
	if room.store == nil || !d.Lookup() {
		return false
	}
	e, ok := room.store.Get(ex.r.Context(), cs.key)
	if !ok || !d.Fresh(s.clock.Now().Sub(e.Stored)) {
		return false
	}
	cs.hit = e
	return true
}

// cacheLookup answers an admitted request from the stored answer cachePeek found:
// the hit's hold is released, never settled, so it charges no tokens and no dollars,
// while the request limits counted it at admission. Otherwise the request goes on
// with its key, for coalescing and for storing its answer.
func (s *Server) cacheLookup(ex *exchange) bool {
	cs := &ex.cache
	if cs.room == nil {
		return true
	}
	cs.result = cs.outcome
	if cs.hit == nil {
		cs.setHeader(ex.w.Header(), cs.result)
		return true
	}
	s.serveHit(ex, cs.hit)
	cs.hit = nil
	return false
}

// scopeFor is cache.ScopeFor, its strings kept for the names a config holds so that
// a request builds none.
func (r *cacheRoom) scopeFor(name, team string) (string, bool) {
	id := name
	switch r.cfg.ScopeOrDefault() {
	case cache.ScopeFleet:
		id = ""
	case cache.ScopeTeam:
		id = team
	}
	if v, ok := r.scopes.Load(id); ok {
		return v.(string), true
	}
	scope, ok := cache.ScopeFor(r.cfg.ScopeOrDefault(), name, team)
	if ok && r.scopeCount.Add(1) <= maxScopeStrings {
		r.scopes.Store(id, scope)
	}
	return scope, ok
}

// serveHit writes a stored answer: its status, Content-Type and body (a stream event
// by event), with this proxy's own headers for the caller's budgets, never the
// upstream's of the request that caused it.
func (s *Server) serveHit(ex *exchange, e *cache.Entry) {
	now := s.clock.Now()
	ex.cache.result = metrics.CacheHit
	h := ex.w.Header()
	ex.cache.setHeader(h, metrics.CacheHit)
	ex.rec.CacheAge = e.Age(now)
	h.Set("Age", strconv.FormatInt(ex.rec.CacheAge, 10))
	if e.ContentType != "" {
		h.Set("Content-Type", e.ContentType)
	}
	refusal.SetLimitHeaders(h, &ex.dec, now, ex.route.family)
	s.agents.Settle(&ex.agent, 0) // one step of its run, no tokens
	ex.status = e.Status
	ex.w.WriteHeader(e.Status)
	rc := http.NewResponseController(ex.w)
	_ = e.EachEvent(func(p []byte) error {
		if _, err := ex.w.Write(p); err != nil {
			return err
		}
		if e.Stream() {
			return rc.Flush()
		}
		return nil
	})
	s.release(ex)
	s.cacheSaved(ex, e.Usage)
}

// coalesce makes a request whose twin is in flight wait for the twin's answer: a
// waiter holds its own reservation (released in full when its answer ends, never
// settled) and no scheduler slot, as it makes no backend call. The first of an
// identical set leads: it goes on to the upstream, and its answer fans out.
func (s *Server) coalesce(ex *exchange) bool {
	cs := &ex.cache
	if !cs.keyed || cs.room.group == nil {
		return true
	}
	for range maxRejoins {
		call, w := cs.room.group.Join(ex.r.Context(), cs.key)
		if call != nil {
			cs.call, cs.led = call, call
			return true
		}
		if !s.serveWaiter(ex, w) {
			return false
		}
	}
	return true
}

// serveWaiter writes the leader's answer as it arrives. It reports true when the
// leader failed before its answer began, so that the request joins again.
func (s *Server) serveWaiter(ex *exchange, w *cache.Waiter) (again bool) {
	defer w.Leave()
	status, ct, err := w.Head()
	if errors.Is(err, cache.ErrLeaderFailed) {
		return true
	}
	if err != nil { // the client went away
		ex.status = 499
		return false
	}
	ex.cache.result = metrics.CacheCoalesced
	h := ex.w.Header()
	ex.cache.setHeader(h, metrics.CacheCoalesced)
	if ct != "" {
		h.Set("Content-Type", ct)
	}
	refusal.SetLimitHeaders(h, &ex.dec, s.clock.Now(), ex.route.family)
	ex.status = status
	ex.w.WriteHeader(status)
	rc := http.NewResponseController(ex.w)
	buf := upstream.Buffers.Get()
	defer upstream.Buffers.Put(buf)
	for {
		n, err := w.Read(buf)
		if n > 0 {
			if _, werr := ex.w.Write(buf[:n]); werr != nil {
				s.release(ex)
				return false
			}
			_ = rc.Flush()
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// The leader's answer was cut, or this client fell too far behind: the
			// client sees its answer end early, as a cut stream.
			s.release(ex)
			ex.rec.End = usage.Cut
			panic(http.ErrAbortHandler)
		}
	}
	s.release(ex)
	s.cacheSaved(ex, w.Usage())
	return false
}

// cacheSaved counts what a hit or a waiter replayed without a backend call, and tells
// the observers of it (a request that cost nothing).
func (s *Server) cacheSaved(ex *exchange, u usage.Usage) {
	s.tellCached(ex, u)
	model := ex.est.Model
	dollars, priced := ex.rt.policy.Cost(model, budget.Used{Input: u.Input, Output: u.Output, Cached: u.Cached})
	if !ex.rt.knownModels[model] {
		model = "other"
	}
	s.metrics.Cache.Saved(model, u.Input, u.Output, dollars, priced)
}

// cacheAnswered starts what the cache does with an answer as its headers arrive: the
// waiters get the head, and a recorder keeps the body to store. It returns the writer
// the decoded body goes to, or nil when the cache takes none of it.
func (ex *exchange) cacheAnswered(resp *http.Response, stream bool) io.Writer {
	cs := &ex.cache
	resp.Header.Del(cacheHeader)
	if !cs.keyed {
		return nil
	}
	success := resp.StatusCode >= 200 && resp.StatusCode <= 299
	if cs.call != nil {
		cs.call.Head(resp.StatusCode, resp.Header)
		if !success {
			cs.call = nil // Head ended it: an error is the leader's own
		}
	}
	if !success {
		return nil
	}
	if cs.store {
		// One copy of the answer: the recorder's, which the waiters read too.
		cs.rec.Reset(cs.room.cfg.EntryBytes(), stream)
		cs.recording = true
		if cs.call != nil {
			cs.rec.Share(cs.call)
		}
		return &cs.rec
	}
	if cs.call != nil {
		return cs.call
	}
	return nil
}

// cacheEnded stores a whole answer, then ends the call that led it: a request that
// arrives after the call finds the stored answer.
func (s *Server) cacheEnded(ex *exchange, status int, header http.Header, end usage.End, verdict usage.Verdict, u usage.Usage) {
	cs := &ex.cache
	if cs.recording {
		e, why := cs.rec.Entry(cache.Answer{Status: status, Header: header, End: end, Verdict: verdict, Usage: u, Stored: s.clock.Now()})
		cs.recording = false
		if why == "" {
			cs.room.store.Put(ex.r.Context(), cs.key, e)
		} else {
			s.metrics.Cache.NotStored.WithLabelValues(why).Inc()
		}
	}
	if cs.call != nil {
		cs.call.Finish(end == usage.Complete, u)
		cs.call = nil
	}
}

// cacheFinish ends the request's part in the cache, however the request ended: a call
// it still leads fails (its waiters join again), and its result is counted.
func (s *Server) cacheFinish(ex *exchange) {
	cs := &ex.cache
	if cs.call != nil {
		cs.call.Fail()
		cs.call = nil
	}
	if cs.led != nil {
		cs.led.Release()
		cs.led = nil
	}
	if cs.result == "" {
		return // not admitted, or the cache is off
	}
	model := ex.est.Model
	if !ex.rt.knownModels[model] {
		model = "other"
	}
	ex.rec.Cache = cs.result
	s.metrics.Cache.Requests.WithLabelValues(model, cs.result).Inc()
}

// drainForWaiters reads the rest of a leader's body when its client has gone and a
// waiter still reads the answer: the upstream call goes on, and the leader's hold
// settles on its whole usage.
func (st *settler) drainForWaiters() {
	if c := st.ex.cache.call; c != nil && !st.eof && c.Waiters() > 0 {
		_, _ = io.Copy(io.Discard, st)
	}
}

// cacheUndecodable ends the cache's part in an answer whose coding the proxy cannot
// read: it is neither stored nor shared (the waiters join again).
func (ex *exchange) cacheUndecodable() {
	ex.cache.recording = false
	ex.cacheFailed()
}

// cacheFailed ends a call whose leader got no answer it can share: its waiters join
// again, the first of them leading.
func (ex *exchange) cacheFailed() {
	if c := ex.cache.call; c != nil {
		c.Fail()
		ex.cache.call = nil
	}
}
