// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Command lab runs the lab's synthetic world (four chat apps, a batch job and a runaway
// agent) through the real proxy. `lab run` runs
// the calibration and every mission and writes a chart per run and the mission table;
// `lab mission N` runs one; `lab size` sizes a token bucket for a burst (the excess of
// peak draw over refill, plus in-flight reservations) and checks it by simulation. docs/scheduling.md "The lab".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/tokenwarden/tokenwarden/test/lab"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "run":
		err = run(ctx, os.Args[2:], "")
	case "mission":
		if len(os.Args) < 3 {
			usage()
		}
		err = run(ctx, os.Args[3:], os.Args[2])
	case "size":
		err = size(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		stop()
		os.Exit(1) //nolint:gocritic // stop ran just above
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  lab run [-world file] [-out dir]              the calibration and every mission
  lab mission calibration|1|2|3|4 [-world file] [-out dir] [-sweep=false]
  lab size -rate R -prompt P -answer A -max-tokens M -tpm T [-burst X -burst-seconds S -duration D]`)
	os.Exit(2)
}

func run(ctx context.Context, args []string, only string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	world := fs.String("world", "", "the world file (default: the checked-in test/lab/world.yaml)")
	out := fs.String("out", "lab-out", "the directory the charts and the table are written to")
	sweep := fs.Bool("sweep", true, "run mission three's sweep of static limits")
	_ = fs.Parse(args)
	w, err := lab.LoadWorld(*world)
	if err != nil {
		return err
	}
	var outcomes []*lab.Outcome
	want := func(m string) bool { return only == "" || only == m }
	progress := func(o *lab.Outcome) {
		outcomes = append(outcomes, o)
		fmt.Print(lab.Table([]*lab.Outcome{o}))
	}
	var calib *lab.Outcome
	if want("calibration") || want("1") {
		if calib, err = w.Calibration(ctx); err != nil {
			return err
		}
		if want("calibration") {
			progress(calib)
		}
	}
	if want("1") {
		o, err := w.MissionOne(ctx, calib.Runs[1])
		if err != nil {
			return err
		}
		progress(o)
	}
	if want("2") {
		o, err := w.MissionTwo(ctx)
		if err != nil {
			return err
		}
		progress(o)
	}
	if want("3") {
		o, err := w.MissionThree(ctx, *sweep)
		if err != nil {
			return err
		}
		progress(o)
	}
	if want("4") {
		o, err := w.MissionFour(ctx)
		if err != nil {
			return err
		}
		progress(o)
	}
	if len(outcomes) == 0 {
		return fmt.Errorf("no mission %q: calibration, 1, 2, 3 or 4", only)
	}
	files, err := lab.Write(*out, w, outcomes)
	if err != nil {
		return err
	}
	for _, f := range files {
		fmt.Println("wrote", f)
	}
	return nil
}

func size(args []string) error {
	fs := flag.NewFlagSet("size", flag.ExitOnError)
	var t lab.Traffic
	fs.Float64Var(&t.Rate, "rate", 1.5, "requests per second normally")
	fs.Float64Var(&t.BurstMultiplier, "burst", 2.5, "the burst's rate, times the normal rate")
	fs.Float64Var(&t.BurstSeconds, "burst-seconds", 30, "the burst's length")
	fs.Float64Var(&t.Prompt, "prompt", 900, "prompt tokens per request")
	fs.Float64Var(&t.Answer, "answer", 250, "answer tokens per request")
	fs.Float64Var(&t.MaxTokens, "max-tokens", 1024, "max_tokens each request reserves")
	fs.Float64Var(&t.Duration, "duration", 4, "seconds a request runs (holds its reservation)")
	fs.Float64Var(&t.TokensPerMinute, "tpm", 200000, "the contract: tokens per minute")
	_ = fs.Parse(args)
	if err := t.Validate(); err != nil {
		return err
	}
	s := lab.Size(t)
	fmt.Print(s)
	fmt.Println("check by simulation (Poisson arrivals, reservation and refund, 20 seeds): share of the burst's requests refused")
	for _, f := range []float64{0.5, 1, 1.5} {
		var sum float64
		for seed := range uint64(20) {
			sum += lab.SimulateBucket(t, f*s.Tokens, seed)
		}
		fmt.Printf("  bucket %8.0f tokens (%4.1f s, %3.0f%% of the rule's): %5.2f%% refused\n", f*s.Tokens, f*s.Seconds, 100*f, 100*sum/20)
	}
	return nil
}
