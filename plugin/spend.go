// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import "github.com/spf13/cobra"

// newSpendCommand is `spend`: what was spent, by tenant, team, key, user or model,
// from the spend ledger. Not available yet.
func newSpendCommand() *cobra.Command {
	return notYet("spend --by tenant|team|key|user|model --since 24h", "What was spent, from the spend ledger",
		"it needs the spend ledger's report endpoint")
}
