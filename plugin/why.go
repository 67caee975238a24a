// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import "github.com/spf13/cobra"

// newWhyCommand is `why KEY`: a key's recent refusals, from every replica's refusal
// audit. Not available yet.
func newWhyCommand() *cobra.Command {
	return notYet("why KEY", "A key's recent refusals, newest first, from every replica's refusal audit",
		"it needs the per-tenant authorization of the replicas' admin reads")
}
