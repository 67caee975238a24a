// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package server_test

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user and system) the test process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
