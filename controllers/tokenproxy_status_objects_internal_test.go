// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import "testing"

// TestInputsDigest: the same inputs give the same digest, never 0 (none), and a
// change of any one input gives another, so that the memo and the queue, which hold
// only the digest, still tell a key whose status must be computed again.
func TestInputsDigest(t *testing.T) {
	base := func() keyStatusInputs {
		return keyStatusInputs{resourceVersion: "41", proxyGeneration: 3, verdict: verdict{accepted: true, reason: "Accepted", message: "ok"},
			fingerprint: "sha256:ab12", contentGen: 7, loaded: loadedState{live: 3, behind: "p-1", behindAt: 6}}
	}
	if a, b := base().digest(), base().digest(); a != b || a == 0 {
		t.Fatalf("the same inputs give %x and %x", a, b)
	}
	for what, change := range map[string]func(*keyStatusInputs){
		"the resourceVersion":    func(in *keyStatusInputs) { in.resourceVersion = "42" },
		"the fleet's generation": func(in *keyStatusInputs) { in.proxyGeneration = 4 },
		"the verdict":            func(in *keyStatusInputs) { in.verdict.accepted = false },
		"the verdict's message":  func(in *keyStatusInputs) { in.verdict.message = "ok." },
		"the fingerprint":        func(in *keyStatusInputs) { in.fingerprint = "sha256:ab13" },
		"the content generation": func(in *keyStatusInputs) { in.contentGen = 8 },
		"the live replicas":      func(in *keyStatusInputs) { in.loaded.live = 4 },
		"the replica behind":     func(in *keyStatusInputs) { in.loaded.behind = "p-2" },
		"what it has loaded":     func(in *keyStatusInputs) { in.loaded.behindAt = 7 },
		"its document":           func(in *keyStatusInputs) { in.loaded.otherDoc = true },
	} {
		in := base()
		change(&in)
		if in.digest() == base().digest() {
			t.Errorf("a change of %s leaves the digest as it was", what)
		}
	}
}
