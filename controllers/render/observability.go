// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Observability renders spec.observability into the document's observability
// block; an unset spec leaves the block out, so the document does not change.
func Observability(c *config.Config, o *twv1alpha1.ObservabilitySpec) {
	if o == nil {
		return
	}
	out := &c.Observability
	out.RefusalAudit.PerKey = o.RefusalsPerKey
	if a := o.AccessLog; a != nil {
		out.AccessLog.Disabled = a.Disabled
		if a.SampleRatio != nil {
			v := quantityFloat(*a.SampleRatio)
			out.AccessLog.SampleRatio = &v
		}
	}
	if t := o.Tracing; t != nil {
		out.Tracing = config.Tracing{Enabled: t.Enabled, Protocol: string(t.Protocol), Endpoint: t.Endpoint,
			Insecure: t.Insecure, ServiceName: t.ServiceName}
		if t.SampleRatio != nil {
			v := quantityFloat(*t.SampleRatio)
			out.Tracing.SampleRatio = &v
		}
	}
}
