// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package tokenize

import (
	"hash/maphash"
	"sync"
)

// A conversation sends its whole history again with every turn, and an agent its
// system prompt and tools with every step: most of a request's text was counted
// before. Each encoding remembers the counts of the strings of at least CacheMinBytes
// it counted last, by a 64-bit hash with a seed drawn when the process starts (no
// caller can aim at a collision) and the string's length, so that only new text is
// tokenized. The cache is bounded: cacheShards shards of at most cacheShardEntries
// counts each, a shard emptied when it is full.

const (
	// CacheMinBytes is the shortest string whose count is remembered: shorter ones
	// cost little more to count than to look up.
	CacheMinBytes = 256
	cacheShards   = 16
	// cacheShardEntries bounds each shard: 16 × 1,024 counts, under a MiB.
	cacheShardEntries = 1024
)

var cacheSeed = maphash.MakeSeed()

type cacheEntry struct {
	size  int
	count int64
}

type cacheShard struct {
	mu sync.Mutex
	m  map[uint64]cacheEntry
}

// countCache is an encoding's remembered counts.
type countCache struct {
	shards [cacheShards]cacheShard
}

func (c *countCache) get(h uint64, size int) (int64, bool) {
	s := &c.shards[h%cacheShards]
	s.mu.Lock()
	e, ok := s.m[h]
	s.mu.Unlock()
	return e.count, ok && e.size == size
}

func (c *countCache) put(h uint64, size int, count int64) {
	s := &c.shards[h%cacheShards]
	s.mu.Lock()
	if s.m == nil || len(s.m) >= cacheShardEntries {
		s.m = make(map[uint64]cacheEntry, cacheShardEntries)
	}
	s.m[h] = cacheEntry{size: size, count: count}
	s.mu.Unlock()
}
