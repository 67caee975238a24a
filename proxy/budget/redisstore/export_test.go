// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

// AdjustScript lets tests load one script without the other.
var ChargeScript = chargeScript
