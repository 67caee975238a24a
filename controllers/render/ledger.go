// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package render

import (
	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// The ledger in the proxy pods.
const (
	// LedgerURLEnv is the proxy's environment variable with the ledger database's URL.
	LedgerURLEnv = "TOKENWARDEN_LEDGER_URL"
	// LedgerSpoolVolume is the pods' emptyDir that holds the ledger's spool, mounted at
	// LedgerSpoolDir (the root filesystem is read-only).
	LedgerSpoolVolume = "ledger-spool"
	LedgerSpoolDir    = "/var/spool/tokenwarden/ledger"
)

// EffectiveLedger is the ledger a fleet records into: its spec.ledger over the
// operator's default def (nil: none), field by field; nil when it records none
// (disabled, or no URL Secret from either).
func EffectiveLedger(tp *twv1alpha1.TokenProxy, def *twv1alpha1.LedgerSpec) *twv1alpha1.LedgerSpec {
	own := tp.Spec.Ledger
	if own != nil && own.Disabled {
		return nil
	}
	var out twv1alpha1.LedgerSpec
	if def != nil {
		def.DeepCopyInto(&out)
	}
	if own != nil {
		if own.URLSecretRef != nil {
			out.URLSecretRef = own.URLSecretRef.DeepCopy()
		}
		if own.SpoolSize != nil {
			q := own.SpoolSize.DeepCopy()
			out.SpoolSize = &q
		}
		if own.FlushIntervalSeconds != 0 {
			out.FlushIntervalSeconds = own.FlushIntervalSeconds
		}
		if own.WhenSpoolFull != "" {
			out.WhenSpoolFull = own.WhenSpoolFull
		}
	}
	if out.Disabled || out.URLSecretRef == nil {
		return nil
	}
	return &out
}

// LedgerSpoolBytes is the spool bound of an effective ledger.
func LedgerSpoolBytes(l *twv1alpha1.LedgerSpec) int64 {
	if l.SpoolSize == nil {
		return config.DefaultLedgerSpoolBytes
	}
	return l.SpoolSize.Value()
}

// Ledger renders an effective ledger (nil: none, and the document does not change)
// into the document: the URL from the environment, the spool on the pod's emptyDir.
func Ledger(c *config.Config, tp *twv1alpha1.TokenProxy, l *twv1alpha1.LedgerSpec) {
	if l == nil {
		return
	}
	c.Ledger = config.Ledger{URLEnv: LedgerURLEnv, Fleet: tp.Namespace + "/" + tp.Name, SpoolDir: LedgerSpoolDir,
		FlushIntervalSeconds: l.FlushIntervalSeconds}
	if l.SpoolSize != nil {
		c.Ledger.SpoolBytes = l.SpoolSize.Value()
	}
	if l.WhenSpoolFull == twv1alpha1.LedgerRefuse {
		c.Ledger.WhenFull = config.LedgerRefuse
	}
}
