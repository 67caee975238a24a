// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Command kubectl-tokenwarden is the kubectl plugin of tokenwarden: on PATH it runs as
// `kubectl tokenwarden`. Its commands are in package plugin.
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/tokenwarden/tokenwarden/plugin"
)

func main() {
	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	os.Exit(plugin.Main(streams, os.Args[1:]))
}
