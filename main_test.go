// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import "testing"

func TestMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    int64
		applied bool
	}{
		{"the container's limit, 90% of it", map[string]string{"MEMORY_LIMIT_BYTES": "268435456"}, 241591905, true},
		{"GOMEMLIMIT wins", map[string]string{"MEMORY_LIMIT_BYTES": "268435456", "GOMEMLIMIT": "100MiB"}, 0, false},
		{"no limit given", map[string]string{}, 0, false},
		{"not a number", map[string]string{"MEMORY_LIMIT_BYTES": "256Mi"}, 0, false},
		{"zero", map[string]string{"MEMORY_LIMIT_BYTES": "0"}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, applied := memoryLimit(func(k string) string { return tc.env[k] })
			if got != tc.want || applied != tc.applied {
				t.Errorf("memoryLimit = %d, %v; want %d, %v", got, applied, tc.want, tc.applied)
			}
		})
	}
}
