// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package metrics

import "github.com/prometheus/client_golang/prometheus"

// Observability counts what the access log did with its lines.
type Observability struct {
	// AccessLogLines is tokenwarden_access_log_lines_total{result}: lines written,
	// dropped (the buffer was full), or failed (the output refused them).
	AccessLogLines *prometheus.CounterVec
	Written        prometheus.Counter
	Dropped        prometheus.Counter
	Failed         prometheus.Counter
}

func newObservability(reg prometheus.Registerer) *Observability {
	o := &Observability{AccessLogLines: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenwarden_access_log_lines_total",
		Help: "Access log lines by result: written, dropped because the buffer was full, or failed to write.",
	}, []string{"result"})}
	reg.MustRegister(o.AccessLogLines)
	o.Written = o.AccessLogLines.WithLabelValues("written")
	o.Dropped = o.AccessLogLines.WithLabelValues("dropped")
	o.Failed = o.AccessLogLines.WithLabelValues("failed")
	return o
}
