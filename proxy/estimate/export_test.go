// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate

// LowerWide and LowerUnit expose the lower bound's shares of a token to the test of
// them against the vocabularies.
var LowerWide, LowerUnit = &lowerWide, int64(lowerUnit)
