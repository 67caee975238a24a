// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !unix

package server_test

import "time"

// processCPU is not measured on this platform: the benchmarks report no CPU figure.
func processCPU() time.Duration { return 0 }
