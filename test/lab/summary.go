// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Summary is a run's figures, the ones the missions speak of.
type Summary struct {
	Name string
	// ChatRequests is the chat requests sent; ChatRefused those refused with 429.
	ChatRequests, ChatRefused int
	// ChatWithinTarget is the share of chat requests sent that started within the
	// interactive target (a refused request did not start).
	ChatWithinTarget float64
	// ChatWaitP95 is the 95th percentile queue wait of admitted chat requests.
	ChatWaitP95 time.Duration
	// BatchOutputPerSecond is the batch tenant's output tokens generated per world
	// second over the traffic's duration.
	BatchOutputPerSecond float64
	// AgentTokensPerSecond is the agent's tokens served (prompt and output) per second.
	AgentTokensPerSecond float64
	// Refused is the 429s by tenant.
	Refused map[string]int
	// TransitP95 is the 95th percentile of the time chat requests took from the
	// client to the backend through the proxy, in world time: the lab's own overhead
	// when the proxy does not hold them.
	TransitP95 time.Duration
	// Utilization is the backend's mean sequences running over its sequences at once.
	Utilization float64
}

// Summarize computes a run's figures.
func (r *Result) Summarize() Summary {
	w := r.World
	s := Summary{Name: r.Policy.Name, Refused: map[string]int{}}
	var waits, transits []time.Duration
	within := 0
	for _, rec := range r.Records {
		if rec.Status == http.StatusTooManyRequests {
			s.Refused[rec.Tenant]++
		}
		switch rec.Kind {
		case KindChat:
			s.ChatRequests++
			if rec.Status == http.StatusTooManyRequests {
				s.ChatRefused++
				continue
			}
			if rec.Arrived >= 0 {
				transits = append(transits, rec.Arrived-rec.Sent)
			}
			wait := rec.Wait(r.End)
			waits = append(waits, wait)
			if rec.Started >= 0 && wait <= w.Target() {
				within++
			}
		case KindAgent:
			if rec.Started >= 0 && rec.Started < w.Duration() {
				s.AgentTokensPerSecond += float64(rec.In)
			}
		}
	}
	if s.ChatRequests > 0 {
		s.ChatWithinTarget = float64(within) / float64(s.ChatRequests)
	}
	if len(waits) > 0 {
		slices.Sort(waits)
		s.ChatWaitP95 = waits[min(len(waits)-1, int(0.95*float64(len(waits))))]
	}
	if len(transits) > 0 {
		slices.Sort(transits)
		s.TransitP95 = transits[min(len(transits)-1, int(0.95*float64(len(transits))))]
	}
	batch := map[string]bool{}
	agent := map[string]bool{}
	for _, t := range w.Tenants {
		batch[t.Name] = t.Kind == KindBatch
		agent[t.Name] = t.Kind == KindAgent
	}
	var seqTime float64
	for _, st := range r.Steps {
		if st.Start >= w.Duration() {
			continue
		}
		d := (st.End - st.Start).Seconds()
		for tenant, n := range st.Generated {
			if batch[tenant] {
				s.BatchOutputPerSecond += float64(n)
			}
			if agent[tenant] {
				s.AgentTokensPerSecond += float64(n)
			}
		}
		for _, n := range st.Sequences {
			seqTime += float64(n) * d
		}
	}
	secs := w.Duration().Seconds()
	s.BatchOutputPerSecond /= secs
	s.AgentTokensPerSecond /= secs
	s.Utilization = seqTime / secs / float64(w.Slots())
	return s
}

// String is the summary on one line.
func (s Summary) String() string {
	return fmt.Sprintf("%-36s chat within target %5.1f%%  chat p95 wait %5.1fs  chat refused %4d/%-5d batch output %5.0f tok/s  agent %6.0f tok/s  backend %3.0f%%  transit p95 %4.2fs  429s %v",
		s.Name, 100*s.ChatWithinTarget, s.ChatWaitP95.Seconds(), s.ChatRefused, s.ChatRequests,
		s.BatchOutputPerSecond, s.AgentTokensPerSecond, 100*s.Utilization, s.TransitP95.Seconds(), s.Refused)
}
