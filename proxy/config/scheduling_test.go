// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package config_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

var _ = Describe("Scheduling", func() {
	It("reads capacity, scheduling and key priorities, with documented defaults", func() {
		c, err := config.Parse([]byte(`
upstreams:
- name: default
  url: "http://127.0.0.1:8000"
  capacity: {max_in_flight_requests: 8, max_in_flight_tokens: 64000}
- {name: other, url: "http://127.0.0.1:8001", models: [m]}
api_keys:
- {name: chat, key_sha256: ` + hash + `, priority: interactive, weight: 3}
- {name: nightly, key_sha256: d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa, priority: batch}
scheduling: {max_queue_wait_seconds: 5, output_weight: 4}
`))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Upstreams[0].Capacity.Enabled()).To(BeTrue())
		Expect(c.Upstreams[1].Capacity.Enabled()).To(BeFalse(), "no capacity: nothing waits")
		Expect(c.APIKeys[0].Weight).To(Equal(3.0))
		Expect(c.APIKeys[1].Priority).To(Equal(config.PriorityBatch))
		Expect(c.Scheduling.MaxQueueWait()).To(Equal(5 * time.Second))
		Expect(c.Scheduling.OutputTokenWeight()).To(Equal(4.0))
		Expect(c.Scheduling.QueueLength()).To(Equal(1000))
		Expect(c.Scheduling.Aging()).To(BeZero(), "no aging unless set: a backlog older than the aging would go ahead of chat")
		Expect(c.Scheduling.Classes.MinShare(config.PriorityInteractive)).To(BeZero())
		Expect(c.Scheduling.Classes.MinShare(config.PriorityBatch)).To(Equal(0.10))
		Expect(c.Scheduling.Classes.MinShare(config.PriorityBackground)).To(Equal(0.05))
		Expect(c.DrainTimeout()).To(Equal(305*time.Second), "a stopping proxy waits for a queued request's wait and its upstream")

		e, err := config.Parse([]byte(minimal + `
scheduling:
  aging_seconds: 60
  classes: {batch: {min_share_percent: 30}, background: {min_share_percent: 50}}
`))
		Expect(err).NotTo(HaveOccurred())
		Expect(e.Scheduling.Aging()).To(Equal(time.Minute))
		Expect(e.Scheduling.Classes.MinShare(config.PriorityBatch)).To(Equal(0.30))
		Expect(e.Scheduling.Classes.MinShare(config.PriorityBackground)).To(Equal(0.50))

		d, err := config.Parse([]byte(minimal))
		Expect(err).NotTo(HaveOccurred())
		Expect(d.Scheduling.MaxQueueWait()).To(Equal(30 * time.Second))
		Expect(d.Scheduling.OutputTokenWeight()).To(Equal(2.0))
		Expect(d.DrainTimeout()).To(Equal(300 * time.Second))
	})

	It("refuses bad values and unknown words, naming the field", func() {
		_, err := config.Parse([]byte(`
upstreams:
- name: default
  url: "http://127.0.0.1:8000"
  capacity: {max_in_flight_requests: -1, max_in_flight_tokenz: 5}
api_keys:
- {name: chat, key_sha256: ` + hash + `, priority: urgent, weight: -2}
scheduling: {max_queue_wait_seconds: -1, aging_seconds: -3, output_weight: -1, min_shares: 2}
`))
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("upstreams[0].capacity.max_in_flight_tokenz: unknown field"))
		Expect(err.Error()).To(ContainSubstring("scheduling.min_shares: unknown field"))

		_, err = config.Parse([]byte(`
upstreams:
- name: default
  url: "http://127.0.0.1:8000"
  capacity: {max_in_flight_requests: -1}
api_keys:
- {name: chat, key_sha256: ` + hash + `, priority: urgent, weight: -2}
scheduling:
  max_queue_wait_seconds: -1
  aging_seconds: -3
  output_weight: -1
  max_queue_length: -4
  classes: {interactive: {min_share_percent: 10}, batch: {min_share_percent: 51}, background: {min_share_percent: -1}}
`))
		Expect(err).To(HaveOccurred())
		for _, f := range []string{
			"upstreams[0].capacity.max_in_flight_requests: must not be negative",
			`api_keys[0].priority: must be "interactive", "batch" or "background", got "urgent"`,
			"api_keys[0].weight: must be a positive number",
			"scheduling.max_queue_wait_seconds: must not be negative",
			"scheduling.max_queue_length: must not be negative",
			"scheduling.aging_seconds: must not be negative",
			"scheduling.output_weight: must be a positive number",
			"scheduling.classes.interactive.min_share_percent: interactive is served first and has no minimum share",
			"scheduling.classes.batch.min_share_percent: must be from 0 to 50, got 51",
			"scheduling.classes.background.min_share_percent: must be from 0 to 50, got -1",
		} {
			Expect(err.Error()).To(ContainSubstring(f))
		}
	})
})
