// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// TestKeyOrder checks a fleet's remembered key order against a full sort through
// keys added, deleted and updated (a new object of the same name) in any order, as
// the informer's index hands them over.
func TestKeyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	newKey := func(ns, name string) *twv1alpha1.ApiKey {
		return &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	live := map[string]*twv1alpha1.ApiKey{}
	var orders keyOrders
	fleet := types.NamespacedName{Namespace: "team", Name: "fleet"}
	names := func(keys []*twv1alpha1.ApiKey) []string {
		out := make([]string, len(keys))
		for i, k := range keys {
			out[i] = k.Namespace + "/" + k.Name
		}
		return out
	}
	for round := range 200 {
		switch op := rng.IntN(4); {
		case op == 0 && len(live) > 0: // delete one or several
			for n := range live {
				delete(live, n)
				if rng.IntN(3) == 0 {
					break
				}
			}
		case op == 1 && len(live) > 0: // update: a new object, same name
			for n, k := range live {
				live[n] = newKey(k.Namespace, k.Name)
				break
			}
		default: // add a few; "a-b/c" and "a/b-c" sort by the joined key
			for range 1 + rng.IntN(5) {
				ns := []string{"a", "a-b", "team"}[rng.IntN(3)]
				name := fmt.Sprintf("k%d", rng.IntN(500))
				live[ns+"/"+name] = newKey(ns, name)
			}
		}
		objs := make([]*twv1alpha1.ApiKey, 0, len(live))
		for _, k := range live {
			objs = append(objs, k)
		}
		rng.Shuffle(len(objs), func(i, j int) { objs[i], objs[j] = objs[j], objs[i] })
		got := orders.of(fleet).sorted(objs)
		want := slices.Clone(objs)
		slices.SortFunc(want, func(a, b *twv1alpha1.ApiKey) int {
			return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
		})
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: the order is %v, want %v", round, names(got), names(want))
		}
	}
}
