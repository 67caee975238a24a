// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package adminauth_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tokenwarden/tokenwarden/proxy/adminauth"
)

// tenantHarness guards /admin/refusals as a tenant path in front of a stub that
// answers the namespaces of data (llm, the fleet's; team-a; team-b) the caller may read.
func tenantHarness() *harness {
	h := &harness{now: time.Unix(1_800_000_000, 0)}
	r := adminauth.New(adminauth.Options{
		TokenReviews:         proxy.AuthenticationV1().TokenReviews(),
		SubjectAccessReviews: proxy.AuthorizationV1().SubjectAccessReviews(),
		Now:                  func() time.Time { h.mu.Lock(); defer h.mu.Unlock(); return h.now },
	})
	stub := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s := adminauth.ScopeOf(req.Context())
		_, _ = io.WriteString(w, strings.Join(s.Readable(req.Context(), []string{"llm", "team-a", "team-b"}), ","))
	})
	h.srv = httptest.NewServer(adminauth.GuardTenants(r, []string{"/healthz"}, []string{"/admin/refusals"}, stub))
	DeferCleanup(h.srv.Close)
	return h
}

// tenantReader binds a token's ServiceAccount to get tokenbudgets in namespace ns.
func tenantReader(token, ns string) {
	GinkgoHelper()
	ctx := context.Background()
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	_, err = admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "budget-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"tokenwarden.io"}, Resources: []string{"tokenbudgets"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	tr, err := admin.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	parts := strings.Split(tr.Status.User.Username, ":") // system:serviceaccount:NS:NAME
	_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "budget-reader-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "budget-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: parts[2], Name: parts[3]}},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
}

var _ = Describe("A tenant path of the admin API", func() {
	It("serves each caller only the namespaces it may read, and the whole path to the admin reader", func() {
		h := tenantHarness()
		reader := serviceAccount("reader", readerRole())
		alice := serviceAccount("alice")
		tenantReader(alice, "team-a")
		platform := serviceAccount("platform")
		tenantReader(platform, "llm")
		stranger := serviceAccount("stranger")

		Expect(h.call(http.MethodGet, "/admin/refusals", reader).body).To(Equal("llm,team-a,team-b"), "the admin reader reads every tenant")
		Expect(h.call(http.MethodGet, "/admin/refusals", alice).body).To(Equal("team-a"), "a tenant reads its own, never team-b's nor the fleet's shared budgets")
		Expect(h.call(http.MethodGet, "/admin/refusals", platform).body).To(Equal("llm"), "the fleet's namespace gives the shared budgets")
		nothing := h.call(http.MethodGet, "/admin/refusals", stranger)
		Expect(nothing.code).To(Equal(http.StatusOK))
		Expect(nothing.body).To(BeEmpty(), "an authenticated caller of no tenant reads nothing")
		Expect(h.call(http.MethodGet, "/admin/refusals", "not-a-token").code).To(Equal(http.StatusUnauthorized))

		By("a path that is not a tenant path stays the reader's")
		h2 := tenantHarness()
		Expect(h2.call(http.MethodGet, "/admin/effective", alice).code).To(Equal(http.StatusForbidden))
	})

	It("reuses each namespace's answer for the decision's time to live", func() {
		h := tenantHarness()
		alice := serviceAccount("alice")
		tenantReader(alice, "team-a")
		Expect(h.call(http.MethodGet, "/admin/refusals", alice).body).To(Equal("team-a"))
		before := calls.Load()
		Expect(h.call(http.MethodGet, "/admin/refusals", alice).body).To(Equal("team-a"))
		Expect(calls.Load()-before).To(BeZero(), "no review within the time to live")
		h.advance(11 * time.Second)
		Expect(h.call(http.MethodGet, "/admin/refusals", alice).body).To(Equal("team-a"))
		Expect(calls.Load()-before).To(Equal(int64(5)), "a TokenReview, the path's review and one per namespace again")
	})
})
