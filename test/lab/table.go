// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"fmt"
	"strings"
	"time"
)

// Table writes the missions' outcomes as text: each mission's question, its runs'
// figures and its checks.
func Table(outcomes []*Outcome) string {
	var b strings.Builder
	for _, o := range outcomes {
		verdict := "MET"
		if !o.OK() {
			verdict = "MISSED"
		}
		fmt.Fprintf(&b, "== %s: %s (%s)\n", o.Mission, o.Question, verdict)
		for _, r := range o.Runs {
			fmt.Fprintf(&b, "   run  %s\n", r.Summarize())
			if r.Disturbed() {
				fmt.Fprintf(&b, "        (the machine held this run up: longest %s, %s in all of %s; its figures are distorted)\n",
					r.Stall.Round(time.Millisecond), r.Stalled.Round(time.Millisecond), r.Wall.Round(time.Second))
			}
		}
		for _, c := range o.Checks {
			mark := "ok  "
			if !c.OK {
				mark = "FAIL"
			}
			fmt.Fprintf(&b, "   %s %s: %s\n", mark, c.Target, c.Got)
		}
	}
	return b.String()
}
