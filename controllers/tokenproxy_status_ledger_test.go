// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/ledger/ledgertest"
	"github.com/tokenwarden/tokenwarden/proxy/report"
)

var _ = Describe("A fleet whose ledger database does not answer", func() {
	It("shows LedgerSpooling while a replica spools, SpoolFull once its spool is full, and Flushed once it drained", func() {
		ns := newNamespace("spool")
		tp := fleetProxy(ns, 1)
		tp.Spec.Ledger = &twv1alpha1.LedgerSpec{URLSecretRef: &twv1alpha1.SecretKeyReference{Name: "ledger-db", Key: "url"}}
		for _, o := range []client.Object{
			credentialSecret(ns, "provider", map[string]string{"anthropic": "upstream"}),
			credentialSecret(ns, "ledger-db", map[string]string{"url": "postgres://tw:pw@pg:5432/ledger"}),
			tp,
		} {
			Expect(k8sClient.Create(ctx, o)).To(Succeed())
		}
		// One replica's ledger and report Lease, as a pod runs them.
		sink, err := ledger.Open(ctx, "sqlite:"+filepath.Join(GinkgoT().TempDir(), "ledger.db"))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(sink.Close)
		db := &ledgertest.Outage{Sink: sink}
		l, err := ledger.New(ledger.Config{Sink: db, Pod: "r1", FlushInterval: -1, SpoolBytes: 8 << 10})
		Expect(err).NotTo(HaveOccurred())
		cs, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		lease := &report.Lease{Client: cs, Namespace: ns, ConfigMap: "fleet-proxy", Replica: "r1", Renew: 200 * time.Millisecond,
			Log: slog.New(slog.NewTextHandler(GinkgoWriter, nil)), Ledger: func() string { return l.State().Encode() }}
		lease.Applied(1, "digest")
		pctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); lease.Run(pctx) }()
		DeferCleanup(func() { stop(); <-done })
		spooling := func(g Gomega) verdict {
			return verdictOf(proxyStatus(g, ns).Conditions, twv1alpha1.ConditionLedgerSpooling)
		}

		Eventually(spooling, enforceTimeout).Should(Equal(verdict{"False", twv1alpha1.ReasonFlushed,
			"Every live replica's settlements reach the ledger database"}))

		By("the database down: the flush spools")
		db.Down.Store(true)
		ledgertest.AddConcurrently(l, 1, 10)
		Expect(l.Flush(ctx)).To(HaveOccurred())
		Eventually(func(g Gomega) {
			v := spooling(g)
			g.Expect(v.Status).To(BeEquivalentTo("True"))
			g.Expect(v.Reason).To(Equal(twv1alpha1.ReasonSpooling))
			g.Expect(v.Message).To(HavePrefix("Replicas r1 cannot write to the ledger database: 1 batches ("))
		}, enforceTimeout).Should(Succeed())

		By("the spool full")
		for range 30 {
			ledgertest.AddConcurrently(l, 2, 40)
			_ = l.Flush(ctx)
		}
		Expect(l.Full()).To(BeTrue())
		Eventually(func(g Gomega) {
			v := spooling(g)
			g.Expect(v.Reason).To(Equal(twv1alpha1.ReasonSpoolFull))
			g.Expect(v.Message).To(ContainSubstring("The spools of r1 are full: what does not fit is not recorded"))
		}, enforceTimeout).Should(Succeed())

		dropped := l.Stats().Dropped
		Expect(dropped.CostMicros).To(BeNumerically(">", 0))
		lost := fmt.Sprintf("The ledger never recorded what these replicas served: r1: %d requests, $%.6f (%d batches dropped with the spool full, 0 expired)",
			dropped.Requests, float64(dropped.CostMicros)/1e6, dropped.Batches)

		By("the database back: drained, and what was dropped still told")
		db.Down.Store(false)
		Expect(l.Flush(ctx)).To(Succeed())
		Eventually(func(g Gomega) {
			v := spooling(g)
			g.Expect(v.Reason).To(Equal(twv1alpha1.ReasonFlushed))
			g.Expect(v.Message).To(HavePrefix("Every live replica's settlements reach the ledger database. " + lost))
		}, enforceTimeout).Should(Succeed())
	})
})
