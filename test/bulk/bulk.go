// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package bulk creates the objects of a large fleet quickly: many ApiKeys, each with
// its labelled Secret, written by several clients at once. The controller tests and
// the end-to-end suite use it to pass a ConfigMap's 1 MiB.
package bulk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// Writers is how many creates run at once.
const Writers = 16

// KeyName is the i-th key's name: 200 characters, unique by i.
func KeyName(i int) string { return fmt.Sprintf("k%05d-%s", i, strings.Repeat("n", 193)) }

// Long is a 246-character value unique by i, for a key's user or team.
func Long(prefix string, i int) string {
	return fmt.Sprintf("%s%05d-%s", prefix, i, strings.Repeat("x", 240))
}

// SecretValue is the i-th key's material.
func SecretValue(i int) string { return fmt.Sprintf("sk-large-%d", i) }

// CreateKeys creates n ApiKeys of the fleet in namespace ns, named KeyName(i), with
// users and teams Long("u", i) and Long("t", i) (about 800 bytes of rendered config
// each), each with its Secret s%05d labelled for ApiKeys and holding SecretValue(i).
func CreateKeys(ctx context.Context, c client.Client, ns, fleet string, n int) error {
	return Parallel(n, Writers, func(i int) error {
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%05d", i), Namespace: ns,
			Labels: map[string]string{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageAPIKey}},
			StringData: map[string]string{"key": SecretValue(i)}}
		key := &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Name: KeyName(i), Namespace: ns},
			Spec: twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: fleet},
				SecretRef: twv1alpha1.SecretKeyReference{Name: secret.Name}, User: Long("u", i), Team: Long("t", i)}}
		return errors.Join(c.Create(ctx, secret), c.Create(ctx, key))
	})
}

// Parallel calls create(i) for every i from 0 to n-1, writers at a time, and returns
// every error, joined.
func Parallel(n, writers int, create func(i int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	next := make(chan int)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := create(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// ShortKeyName is the i-th key of CreateShortKeys, and its Secret's name.
func ShortKeyName(i int) string { return fmt.Sprintf("key-%06d", i) }

// CreateShortKeys creates the ApiKeys from to from+n-1 of the fleet in namespace ns,
// named ShortKeyName(i), user user-<i> and team team-<i mod 100> (about 160 bytes of
// rendered config each, as a platform's keys are), each with its labelled Secret of
// the same name holding SecretValue(i); writers at a time.
func CreateShortKeys(ctx context.Context, c client.Client, ns, fleet string, from, n, writers int) error {
	return Parallel(n, writers, func(j int) error {
		i := from + j
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: ShortKeyName(i), Namespace: ns,
			Labels: map[string]string{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageAPIKey}},
			StringData: map[string]string{"key": SecretValue(i)}}
		if err := c.Create(ctx, secret); err != nil {
			return err
		}
		return c.Create(ctx, ShortKey(ns, fleet, i))
	})
}

// ShortKey is the i-th ApiKey of CreateShortKeys.
func ShortKey(ns, fleet string, i int) *twv1alpha1.ApiKey {
	return &twv1alpha1.ApiKey{ObjectMeta: metav1.ObjectMeta{Name: ShortKeyName(i), Namespace: ns},
		Spec: twv1alpha1.ApiKeySpec{ProxyRef: twv1alpha1.ProxyReference{Name: fleet},
			SecretRef: twv1alpha1.SecretKeyReference{Name: ShortKeyName(i)},
			User:      fmt.Sprintf("user-%d", i), Team: fmt.Sprintf("team-%d", i%100)}}
}
