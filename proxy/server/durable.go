// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

// recoveringRetryAfter is the Retry-After of a 503 budget_recovering: recovery waits
// for an administrator, so clients are told to come back in half a minute rather than
// at once.
const recoveringRetryAfter = "30"
