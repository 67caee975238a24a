// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package cache

import (
	"container/list"
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
	items map[[32]byte]*list.Element
	lru   list.List // front: most recently used
	bytes int64
	counters
}

type memItem struct {
	key   Key
	entry *Entry
}

// size is the item's bytes: its entry's, its key's strings and the list element and
// map slot that hold it.
func (it *memItem) size() int64 {
	return it.entry.Size() + int64(len(it.key.Scope)+len(it.key.Model)) + 128
}

// NewMemory is a store of at most maxBytes whose entries live for ttl on clock.
func NewMemory(clock Clock, ttl time.Duration, maxBytes int64) *Memory {
	return &Memory{clock: clock, ttl: ttl, maxBytes: maxBytes, items: make(map[[32]byte]*list.Element)}
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, k Key) (*Entry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	el, ok := m.items[k.Hash]
	if !ok {
		return nil, false
	}
	it := el.Value.(*memItem)
	if m.clock.Now().Sub(it.entry.Stored) >= m.ttl {
		m.removeLocked(el)
		m.expired.Add(1)
		return nil, false
	}
	m.lru.MoveToFront(el)
	return it.entry, true
}

// Put implements Store. An entry larger than the whole store is not kept.
func (m *Memory) Put(_ context.Context, k Key, e *Entry) {
	it := &memItem{key: k, entry: e}
	size := it.size()
	if size > m.maxBytes {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.items[k.Hash]; ok {
		m.removeLocked(el)
	}
	for m.bytes+size > m.maxBytes {
		m.removeLocked(m.lru.Back())
		m.evictions.Add(1)
	}
	m.items[k.Hash] = m.lru.PushFront(it)
	m.bytes += size
}

func (m *Memory) removeLocked(el *list.Element) {
	it := m.lru.Remove(el).(*memItem)
	delete(m.items, it.key.Hash)
	m.bytes -= it.size()
}

// Purge implements Store.
func (m *Memory) Purge(_ context.Context, match Match) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for el := m.lru.Front(); el != nil; {
		next := el.Next()
		if match.matches(el.Value.(*memItem).key) {
			m.removeLocked(el)
			n++
		}
		el = next
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
