// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
)

// Attestation is the body of POST /admin/durable/attest.
type Attestation struct {
	// Mode is "restore" (write Balances over what Redis holds, then trust it) or
	// "adopt" (start the current windows from what Redis holds now).
	Mode string `json:"mode"`
	// Balances are the durable counters' spend in their current windows (restore only).
	Balances []budget.Balance `json:"balances,omitempty"`
}

// AttestResult is the answer of POST /admin/durable/attest.
type AttestResult struct {
	// Epoch is the new epoch the replica runs under; the others run under it once the
	// operator has written it into their config.
	Epoch    string `json:"epoch"`
	Restored int    `json:"restored"`
}

// maxAttestBody bounds an attestation's body.
const maxAttestBody = 8 << 20

// durableEpochs serves GET /admin/durable: the slot groups and the epoch each runs
// under, fenced or not.
func durableEpochs(src Source, w http.ResponseWriter, _ *http.Request) {
	ds, ok := src.Durable()
	if !ok {
		http.Error(w, "this proxy keeps no durable counters (rate_limiting.storage is not redis)", http.StatusConflict)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"groups": ds.Epochs()})
}

// attest serves POST /admin/durable/attest: it ends a fence by restoring the balances
// given, or by adopting what Redis holds, and writing a new epoch (docs/runbooks.md).
func attest(src Source, log *slog.Logger, w http.ResponseWriter, r *http.Request) {
	ds, ok := src.Durable()
	switch {
	case !ok:
		http.Error(w, "this proxy keeps no durable counters (rate_limiting.storage is not redis)", http.StatusConflict)
		return
	case !src.Ready():
		http.Error(w, "no configuration loaded yet", http.StatusServiceUnavailable)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxAttestBody+1))
	if err != nil || len(body) > maxAttestBody {
		http.Error(w, fmt.Sprintf("the body could not be read, or is larger than %d bytes", maxAttestBody), http.StatusBadRequest)
		return
	}
	var a Attestation
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		http.Error(w, "the body is not an attestation: "+err.Error(), http.StatusBadRequest)
		return
	}
	var restore []budget.Charge
	switch a.Mode {
	case "restore":
		if len(a.Balances) == 0 {
			http.Error(w, "balances: required with mode restore (mode adopt starts the windows from what Redis holds)", http.StatusBadRequest)
			return
		}
		seen := map[budget.Key]int{}
		for i, b := range a.Balances {
			ch, err := src.RestoreCharge(b)
			if err != nil {
				http.Error(w, fmt.Sprintf("balances[%d]: %v", i, err), http.StatusBadRequest)
				return
			}
			if j, dup := seen[ch.Key]; dup {
				http.Error(w, fmt.Sprintf("balances[%d]: the same counter as balances[%d]", i, j), http.StatusBadRequest)
				return
			}
			seen[ch.Key] = i
			restore = append(restore, ch)
		}
	case "adopt":
		if len(a.Balances) > 0 {
			http.Error(w, "balances: not allowed with mode adopt (use mode restore)", http.StatusBadRequest)
			return
		}
	default:
		http.Error(w, fmt.Sprintf("mode: want \"restore\" or \"adopt\", got %q", a.Mode), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	epoch, err := ds.Attest(ctx, restore)
	if err != nil {
		status := http.StatusServiceUnavailable
		if errors.Is(err, context.Canceled) {
			status = http.StatusBadRequest
		}
		http.Error(w, "the attestation could not be written to Redis: "+err.Error(), status)
		return
	}
	log.Warn("Durable counters attested by an administrator", "mode", a.Mode, "balances", len(restore), "epoch", epoch)
	writeJSON(w, http.StatusOK, AttestResult{Epoch: epoch, Restored: len(restore)})
}
