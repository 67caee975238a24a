// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// TestRenderInputs: each input of the document changes the digest a fleet's config
// outcome is reused by; the same inputs give the same digest.
func TestRenderInputs(t *testing.T) {
	base := func() *fleet {
		tp := &twv1alpha1.TokenProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "fleet", UID: "u-tp", Generation: 3}}
		b := &twv1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "b", UID: "u-b", Generation: 1}}
		key := func(name string) keyInput {
			return keyInput{key: &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("u-" + name), Generation: 1}},
				hash: "h-" + name}
		}
		return &fleet{proxy: tp, budgets: []*twv1alpha1.TokenBudget{b}, keys: []keyInput{key("a"), key("b")}, divisor: 3}
	}
	want := renderInputs(base())
	if got := renderInputs(base()); got != want {
		t.Fatal("the same inputs give another digest")
	}
	changes := map[string]func(f *fleet){
		"the fleet's spec":             func(f *fleet) { f.proxy.Generation++ },
		"the fleet, recreated":         func(f *fleet) { f.proxy.UID = "u-tp-2" },
		"a durable epoch":              func(f *fleet) { f.proxy.Status.DurableEpochs = []twv1alpha1.DurableEpoch{{Group: "g", Epoch: "1-a"}} },
		"the division":                 func(f *fleet) { f.divisor = 4 },
		"a budget's spec":              func(f *fleet) { f.budgets[0].Generation++ },
		"a budget less":                func(f *fleet) { f.budgets = nil },
		"a key's spec":                 func(f *fleet) { f.keys[1].key.Generation++ },
		"a key's Secret":               func(f *fleet) { f.keys[0].hash = "h-rotated" },
		"a key less":                   func(f *fleet) { f.keys = f.keys[:1] },
		"the keys' order":              func(f *fleet) { f.keys[0], f.keys[1] = f.keys[1], f.keys[0] },
		"a key renamed":                func(f *fleet) { f.keys[1].key.Name = "c" },
		"a key from another namespace": func(f *fleet) { f.keys[1].key.Namespace = "other" },
		// Lengths are written before strings: ("ab", "c") is not ("a", "bc").
		"a name's boundary": func(f *fleet) { f.keys[0].key.Name, f.keys[0].hash = "ah", "-a" },
	}
	for what, change := range changes {
		f := base()
		change(f)
		if renderInputs(f) == want {
			t.Errorf("%s does not change the digest of the inputs", what)
		}
	}
}
