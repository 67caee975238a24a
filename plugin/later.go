// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"fmt"

	"github.com/spf13/cobra"
)

// notYet is a command this version registers but does not run: it says so on one
// line and exits with 1, so that a script never mistakes it for an empty answer.
func notYet(use, short, needs string) *cobra.Command {
	return &cobra.Command{
		Use:                use,
		Short:              short + " (not available in this version)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fmt.Errorf("kubectl tokenwarden %s is not available in this version: %s", cmd.Name(), needs)
		},
	}
}
