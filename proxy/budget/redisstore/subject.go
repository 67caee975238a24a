// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import "github.com/tokenwarden/tokenwarden/proxy/budget"

// SubjectPrefix is the prefix of the keys of k's subject, hash tag included:
// {prefix}: on one server, its slot group's {prefix:N}: on a cluster. Keys another
// room of the proxy keeps under it share the subject's slot, and the fleet's key
// pattern (docs/redis.md) covers them.
func (s *Store) SubjectPrefix(k budget.Key) string {
	if s.sharded {
		return s.groups[groupOf(k)].prefix
	}
	return s.prefix
}
