// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"flag"
	"io"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
)

// TestProxyLedgerFlags is the chart's proxyLedger as the operator reads it, and the
// ledger it gives a fleet that names no URL Secret of its own.
func TestProxyLedgerFlags(t *testing.T) {
	parse := func(args ...string) (*twv1alpha1.LedgerSpec, error) {
		fs := flag.NewFlagSet("operator", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		read := ProxyLedgerFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return read()
	}
	if l, err := parse("--proxy-ledger-spool-size=1Gi"); l != nil || err != nil {
		t.Fatalf("without --proxy-ledger-secret: want no default ledger, got %+v, %v", l, err)
	}
	def, err := parse("--proxy-ledger-secret=ledger-db", "--proxy-ledger-spool-size=16Mi", "--proxy-ledger-when-spool-full=Refuse")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--proxy-ledger-secret=x", "--proxy-ledger-spool-size=lots"}, "--proxy-ledger-spool-size"},
		{[]string{"--proxy-ledger-secret=x", "--proxy-ledger-spool-size=100Ki"}, "--proxy-ledger-spool-size"},
		{[]string{"--proxy-ledger-secret=x", "--proxy-ledger-when-spool-full=Block"}, "--proxy-ledger-when-spool-full"},
		{[]string{"--proxy-ledger-secret=x", "--proxy-ledger-secret-key="}, "--proxy-ledger-secret-key"},
	} {
		if _, err := parse(c.args...); err == nil || !strings.HasPrefix(err.Error(), c.flag+":") {
			t.Errorf("%v: want an error naming %s, got %v", c.args, c.flag, err)
		}
	}

	none := &twv1alpha1.TokenProxy{}
	got := render.EffectiveLedger(none, def)
	if got == nil || got.URLSecretRef.Name != "ledger-db" || got.URLSecretRef.Key != "url" || render.LedgerSpoolBytes(got) != 16<<20 ||
		got.WhenSpoolFull != twv1alpha1.LedgerRefuse {
		t.Errorf("a fleet that names no ledger: want the operator's, got %+v", got)
	}
	if refs := credentialRefs(none, def); len(refs) != 1 || !strings.Contains(refs[0].field, "--proxy-ledger-secret") {
		t.Errorf("the default ledger's Secret is one the pods read, named as the operator's: %+v", refs)
	}
	own := &twv1alpha1.TokenProxy{Spec: twv1alpha1.TokenProxySpec{Ledger: &twv1alpha1.LedgerSpec{SpoolSize: ptr.To(resource.MustParse("8Mi"))}}}
	if got := render.EffectiveLedger(own, def); got == nil || got.URLSecretRef.Name != "ledger-db" || render.LedgerSpoolBytes(got) != 8<<20 {
		t.Errorf("a fleet that sets only its spool: the operator's database with its own spool, got %+v", got)
	}
	off := &twv1alpha1.TokenProxy{Spec: twv1alpha1.TokenProxySpec{Ledger: &twv1alpha1.LedgerSpec{Disabled: true}}}
	if got := render.EffectiveLedger(off, def); got != nil {
		t.Errorf("a fleet that disables its ledger records none, whatever the default: got %+v", got)
	}
	if got := render.EffectiveLedger(own, nil); got != nil {
		t.Errorf("no URL Secret from the fleet or the operator: no ledger, got %+v", got)
	}
}
