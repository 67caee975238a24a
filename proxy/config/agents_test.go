// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("Limits for agents and class bounds", func() {
	It("reads class deadlines, output caps, run limits and in-flight limits, with documented defaults", func() {
		c, err := config.Parse([]byte(`
upstreams:
- name: default
  url: "http://127.0.0.1:8000"
  capacity: {max_in_flight_requests: 8}
api_keys:
- {name: agent, key_sha256: ` + hash + `, max_in_flight: 4, run_token_budget: 200000, run_max_steps: 50}
scheduling:
  max_queue_wait_seconds: 20
  classes:
    interactive: {max_queue_wait_seconds: 2, max_output_tokens: 1024}
    background: {max_queue_wait_seconds: 120, max_output_tokens: 8192, over_max_output_tokens: refuse}
agents: {max_runs: 500}
`))
		Expect(err).NotTo(HaveOccurred())
		sc := &c.Scheduling
		Expect(sc.Classes.Of(config.PriorityInteractive).MaxQueueWait(sc)).To(Equal(2 * time.Second))
		Expect(sc.Classes.Of(config.PriorityBatch).MaxQueueWait(sc)).To(Equal(20*time.Second), "a class without its own wait has scheduling's")
		Expect(sc.LongestQueueWait()).To(Equal(120 * time.Second))
		Expect(sc.Classes.Of(config.PriorityBackground).OverMaxOutputTokens).To(Equal(config.OverRefuse))
		Expect(c.APIKeys[0].MaxInFlight).To(Equal(int64(4)))
		Expect(c.Agents.Runs()).To(Equal(500))
		Expect(c.Agents.RunIdle()).To(Equal(900 * time.Second))
		Expect(sc.QueueBytes()).To(Equal(int64(256 << 20)))
		Expect(c.DrainTimeout()).To(Equal(420*time.Second), "a stopping proxy waits for the longest class's wait and the upstream")
	})

	It("refuses bad values, naming the field", func() {
		_, err := config.Parse([]byte(`
upstreams:
- {name: default, url: "http://127.0.0.1:8000"}
api_keys:
- {name: agent, key_sha256: ` + hash + `, max_in_flight: -1, run_token_budget: -2, run_max_steps: -3}
scheduling:
  max_queue_bytes: -1
  classes:
    batch: {max_queue_wait_seconds: -1, max_output_tokens: -5, over_max_output_tokens: truncate}
agents: {max_runs: -1, run_idle_seconds: -1}
`))
		Expect(err).To(HaveOccurred())
		for _, f := range []string{
			"api_keys[0].max_in_flight: must not be negative",
			"api_keys[0].run_token_budget: must not be negative",
			"api_keys[0].run_max_steps: must not be negative",
			"scheduling.classes.batch.max_queue_wait_seconds: must not be negative",
			"scheduling.classes.batch.max_output_tokens: must not be negative",
			`scheduling.classes.batch.over_max_output_tokens: must be "clamp" or "refuse", got "truncate"`,
			"agents.max_runs: must not be negative",
			"scheduling.max_queue_bytes: must not be negative",
			"agents.run_idle_seconds: must not be negative",
		} {
			Expect(err.Error()).To(ContainSubstring(f))
		}
		_, err = config.Parse([]byte(`
upstreams:
- {name: default, url: "http://127.0.0.1:8000"}
scheduling: {classes: {urgent: {max_queue_wait_seconds: 1}}}
`))
		Expect(err).To(MatchError(ContainSubstring("scheduling.classes.urgent: unknown field")))
	})
})
