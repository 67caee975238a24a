// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"errors"
	"fmt"
)

// step is one independent phase of a fleet's reconcile. A failing step does not stop
// the steps that do not depend on it (a config that cannot be written never stops a
// scale); it sets the TokenProxy's Degraded condition, with the reason
// <step>Failed, and the reconcile is retried with backoff.
type step string

// The steps, in the order they run.
const (
	stepConfigMap        step = "ConfigMap"
	stepRBAC             step = "RBAC" // the pods' ServiceAccount, Role and RoleBinding
	stepDeployment       step = "Deployment"
	stepServices         step = "Services"
	stepDisruptionBudget step = "PodDisruptionBudget"
	stepServiceMonitor   step = "ServiceMonitor"
	stepNetworkPolicy    step = "NetworkPolicy"
	stepStatus           step = "Status" // the report Leases and the TokenBudgets' and ApiKeys' statuses
	// stepRead reads what the fleet is rendered from; when it fails no other step runs.
	stepRead step = "Read"
)

// stepFailure is a step's error.
type stepFailure struct {
	step step
	err  error
}

// steps collects the failures of one reconcile.
type steps struct{ failed []stepFailure }

// record notes err, if any, as the failure of s, and reports whether s succeeded.
func (ss *steps) record(s step, err error) bool {
	if err == nil {
		return true
	}
	ss.failed = append(ss.failed, stepFailure{step: s, err: err})
	return false
}

// err is every failure, joined: what Reconcile returns so that it is retried.
func (ss *steps) err() error {
	errs := make([]error, 0, len(ss.failed))
	for _, f := range ss.failed {
		errs = append(errs, fmt.Errorf("%s: %w", f.step, f.err))
	}
	return errors.Join(errs...)
}
