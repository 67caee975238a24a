// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"flag"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// ProxyLedgerFlags binds the operator's --proxy-ledger-* flags, the ledger of every
// fleet whose TokenProxy names no URL Secret (the chart's proxyLedger values): the
// Secret of that name in each fleet's namespace. The function returned reads them
// after parsing: nil without --proxy-ledger-secret, an error naming the flag for a
// bad value.
func ProxyLedgerFlags(fs *flag.FlagSet) func() (*twv1alpha1.LedgerSpec, error) {
	secret := fs.String("proxy-ledger-secret", "", "Record every fleet whose TokenProxy names no ledger in the PostgreSQL database whose URL this Secret, in the fleet's namespace, holds (labelled tokenwarden.io/secret=credential).")
	key := fs.String("proxy-ledger-secret-key", "url", "With --proxy-ledger-secret: the Secret's key that holds the URL.")
	spool := fs.String("proxy-ledger-spool-size", "", "With --proxy-ledger-secret: the bound of each pod's spool, a quantity such as 64Mi (default 64Mi).")
	full := fs.String("proxy-ledger-when-spool-full", "", "With --proxy-ledger-secret: KeepServing (the default) or Refuse.")
	return func() (*twv1alpha1.LedgerSpec, error) {
		if *secret == "" {
			return nil, nil
		}
		if *key == "" {
			return nil, fmt.Errorf("--proxy-ledger-secret-key: empty")
		}
		l := &twv1alpha1.LedgerSpec{URLSecretRef: &twv1alpha1.SecretKeyReference{Name: *secret, Key: *key}}
		if *spool != "" {
			q, err := resource.ParseQuantity(*spool)
			if err != nil || q.Cmp(resource.MustParse("1Mi")) < 0 || q.Cmp(resource.MustParse("8Gi")) > 0 {
				return nil, fmt.Errorf("--proxy-ledger-spool-size: want a quantity from 1Mi to 8Gi, got %q", *spool)
			}
			l.SpoolSize = &q
		}
		switch p := twv1alpha1.LedgerFullPolicy(*full); p {
		case "", twv1alpha1.LedgerKeepServing, twv1alpha1.LedgerRefuse:
			l.WhenSpoolFull = p
		default:
			return nil, fmt.Errorf("--proxy-ledger-when-spool-full: want %q or %q, got %q", twv1alpha1.LedgerKeepServing, twv1alpha1.LedgerRefuse, p)
		}
		return l, nil
	}
}
