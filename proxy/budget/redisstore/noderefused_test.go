// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/test/redisserver"
)

var _ = Describe("A cluster master that refuses the scripts", func() {
	It("is said to refuse them, apart from being unreachable", func() {
		cluster := redisserver.StartCluster(GinkgoT(), 3, 0)
		restrictUser(cluster.Masters, "noscripts", "~*", []string{"+@all", "-@scripting"})
		var logs bytes.Buffer
		s, err := redisstore.New(redisstore.Options{
			URL:         strings.Replace(cluster.URL(), "redis+cluster://", "redis+cluster://noscripts:pw@", 1),
			DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		_, err = s.Reserve(context.Background(), everyDimension(1))
		var ue *budget.UnavailableError
		Expect(err).To(BeAssignableToTypeOf(ue))
		Expect(logs.String()).To(ContainSubstring("A Redis Cluster master refused the budget scripts; the slot groups it serves are skipped, refusing their requests with 503, until it runs them"))
		Expect(logs.String()).To(ContainSubstring("NOPERM"))
		Expect(logs.String()).NotTo(ContainSubstring("unreachable"))
	})
})
