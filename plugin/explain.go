// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import "github.com/spf13/cobra"

// newExplainCommand is `explain KEY`: every budget and rule that applies to a key, as
// the proxy's own resolver orders them. Not available yet.
func newExplainCommand() *cobra.Command {
	return notYet("explain KEY [--model M] [--route R]", "Every budget and rule that applies to a key, in the order they are reserved",
		"it needs the proxy's admin endpoint that resolves a key's budgets")
}
