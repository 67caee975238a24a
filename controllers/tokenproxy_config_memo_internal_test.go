// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// TestRenderInputs: each input of the document changes the digest a fleet's config
// outcome is reused by; the same inputs give the same digest.
func TestRenderInputs(t *testing.T) {
	base := func() *render.Fleet {
		tp := &twv1alpha1.TokenProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "fleet", UID: "u-tp", Generation: 3}}
		b := &twv1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "b", UID: "u-b", Generation: 1}}
		key := func(name string) render.KeyInput {
			return render.KeyInput{Key: &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("u-" + name), Generation: 1}},
				Hash: "h-" + name}
		}
		return &render.Fleet{Proxy: tp, Budgets: []*twv1alpha1.TokenBudget{b}, Keys: []render.KeyInput{key("a"), key("b")}, Divisor: 3}
	}
	want := renderInputs(base())
	if got := renderInputs(base()); got != want {
		t.Fatal("the same inputs give another digest")
	}
	changes := map[string]func(f *render.Fleet){
		"the fleet's spec":     func(f *render.Fleet) { f.Proxy.Generation++ },
		"the fleet, recreated": func(f *render.Fleet) { f.Proxy.UID = "u-tp-2" },
		"a durable epoch": func(f *render.Fleet) {
			f.Proxy.Status.DurableEpochs = []twv1alpha1.DurableEpoch{{Group: "g", Epoch: "1-a"}}
		},
		"the division":                 func(f *render.Fleet) { f.Divisor = 4 },
		"a budget's spec":              func(f *render.Fleet) { f.Budgets[0].Generation++ },
		"a budget less":                func(f *render.Fleet) { f.Budgets = nil },
		"a key's spec":                 func(f *render.Fleet) { f.Keys[1].Key.Generation++ },
		"a key's Secret":               func(f *render.Fleet) { f.Keys[0].Hash = "h-rotated" },
		"a key less":                   func(f *render.Fleet) { f.Keys = f.Keys[:1] },
		"the keys' order":              func(f *render.Fleet) { f.Keys[0], f.Keys[1] = f.Keys[1], f.Keys[0] },
		"a key renamed":                func(f *render.Fleet) { f.Keys[1].Key.Name = "c" },
		"a key from another namespace": func(f *render.Fleet) { f.Keys[1].Key.Namespace = "other" },
		// Lengths are written before strings: ("ab", "c") is not ("a", "bc").
		"a name's boundary": func(f *render.Fleet) { f.Keys[0].Key.Name, f.Keys[0].Hash = "ah", "-a" },
	}
	for what, change := range changes {
		f := base()
		change(f)
		if renderInputs(f) == want {
			t.Errorf("%s does not change the digest of the inputs", what)
		}
	}
}
