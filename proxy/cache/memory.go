// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache

import (
	"context"
	"sync"
	"time"
)

// Memory is a replica's own store: least recently used entries are dropped to keep
// what it holds within a number of bytes.
type Memory struct {
	clock    Clock
	ttl      time.Duration
	maxBytes int64

	mu    sync.Mutex
	items map[[32]byte]*memItem
	// lru is the ring of items in use order: lru.next is the most recently used,
	// lru.prev the least.
	lru   memItem
	bytes int64
	counters
}

// memItem is one stored entry and its place in the use order: one allocation for
// each entry kept.
type memItem struct {
	key        Key
	entry      Entry
	prev, next *memItem
}

// size is the item's bytes: its entry's, its key's strings, its links and the map
// slot that holds it.
func (it *memItem) size() int64 {
	return it.entry.Size() + int64(len(it.key.Scope)+len(it.key.Model)) + 128
}

// NewMemory is a store of at most maxBytes whose entries live for ttl on clock.
func NewMemory(clock Clock, ttl time.Duration, maxBytes int64) *Memory {
	m := &Memory{clock: clock, ttl: ttl, maxBytes: maxBytes, items: make(map[[32]byte]*memItem)}
	m.lru.prev, m.lru.next = &m.lru, &m.lru
	return m
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, k Key) (*Entry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it, ok := m.items[k.Hash]
	if !ok {
		return nil, false
	}
	if m.clock.Now().Sub(it.entry.Stored) >= m.ttl {
		m.removeLocked(it)
		m.expired.Add(1)
		return nil, false
	}
	m.unlinkLocked(it)
	m.pushFrontLocked(it)
	return &it.entry, true
}

// Put implements Store. An entry larger than the whole store is not kept.
func (m *Memory) Put(_ context.Context, k Key, e Entry) {
	it := &memItem{key: k, entry: e}
	size := it.size()
	if size > m.maxBytes {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.items[k.Hash]; ok {
		m.removeLocked(old)
	}
	for m.bytes+size > m.maxBytes {
		m.removeLocked(m.lru.prev)
		m.evictions.Add(1)
	}
	m.items[k.Hash] = it
	m.pushFrontLocked(it)
	m.bytes += size
}

func (m *Memory) removeLocked(it *memItem) {
	m.unlinkLocked(it)
	delete(m.items, it.key.Hash)
	m.bytes -= it.size()
}

func (m *Memory) unlinkLocked(it *memItem) {
	it.prev.next, it.next.prev = it.next, it.prev
	it.prev, it.next = nil, nil
}

func (m *Memory) pushFrontLocked(it *memItem) {
	it.prev, it.next = &m.lru, m.lru.next
	m.lru.next.prev = it
	m.lru.next = it
}

// Purge implements Store.
func (m *Memory) Purge(_ context.Context, match Match) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for it := m.lru.next; it != &m.lru; {
		next := it.next
		if match.matches(it.key) {
			m.removeLocked(it)
			n++
		}
		it = next
	}
	return n, nil
}

// Stats implements Store.
func (m *Memory) Stats() Stats {
	s := m.stats()
	m.mu.Lock()
	s.Entries, s.Bytes = int64(len(m.items)), m.bytes
	m.mu.Unlock()
	return s
}
