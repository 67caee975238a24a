// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package adminauth_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tokenwarden/tokenwarden/proxy/adminauth"
)

// The admin API of one proxy, guarded, in front of a stub that says which path it
// served.
type harness struct {
	srv *httptest.Server
	now time.Time
	mu  sync.Mutex
}

func newHarness(ttl time.Duration) *harness {
	h := &harness{now: time.Unix(1_800_000_000, 0)}
	r := adminauth.New(adminauth.Options{
		TokenReviews:         proxy.AuthenticationV1().TokenReviews(),
		SubjectAccessReviews: proxy.AuthorizationV1().SubjectAccessReviews(),
		TTL:                  ttl,
		Now: func() time.Time {
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.now
		},
	})
	stub := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { _, _ = io.WriteString(w, "served "+req.URL.Path) })
	h.srv = httptest.NewServer(adminauth.Guard(r, []string{"/healthz", "/readyz", "/metrics"}, stub))
	DeferCleanup(h.srv.Close)
	return h
}

func (h *harness) advance(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.now = h.now.Add(d)
}

type answer struct {
	code  int
	body  string
	error struct {
		Code    int    `json:"code"`
		Type    string `json:"type"`
		Message string `json:"message"`
	}
}

func (h *harness) call(method, path, token string) answer {
	GinkgoHelper()
	req, err := http.NewRequest(method, h.srv.URL+path, nil)
	Expect(err).NotTo(HaveOccurred())
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	a := answer{code: resp.StatusCode, body: string(b)}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error json.RawMessage `json:"error"`
		}
		Expect(json.Unmarshal(b, &e)).To(Succeed(), "a refusal is JSON: %s", b)
		Expect(json.Unmarshal(e.Error, &a.error)).To(Succeed())
	}
	return a
}

var namespaces int

// serviceAccount creates a ServiceAccount in a fresh namespace and returns a token
// of it, as `kubectl create token` does; boundTo names ClusterRoles to bind it to.
func serviceAccount(name string, boundTo ...string) string {
	GinkgoHelper()
	ctx := context.Background()
	namespaces++
	ns := fmt.Sprintf("adminauth-%d", namespaces)
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	_, err = admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	for _, role := range boundTo {
		_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name + "-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
	}
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// readerRole installs the ClusterRole the project ships (config/rbac) and returns its
// name, prefixed as config/default and the chart name it.
func readerRole() string {
	GinkgoHelper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "proxy_admin_reader_role.yaml"))
	Expect(err).NotTo(HaveOccurred())
	var role rbacv1.ClusterRole
	Expect(yaml.UnmarshalStrict(data, &role)).To(Succeed())
	role.Name = "tokenwarden-" + role.Name
	_, err = admin.RbacV1().ClusterRoles().Get(context.Background(), role.Name, metav1.GetOptions{})
	if err != nil {
		_, err = admin.RbacV1().ClusterRoles().Create(context.Background(), &role, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
	}
	return role.Name
}

var _ = Describe("The guarded admin API", func() {
	It("answers 401 without a token or with one the API server does not know, 403 to a caller without the reader role, and serves a reader", func() {
		h := newHarness(10 * time.Second)
		reader := serviceAccount("reader", readerRole())
		stranger := serviceAccount("stranger")

		a := h.call(http.MethodGet, "/admin/effective", "")
		Expect(a.code).To(Equal(http.StatusUnauthorized))
		Expect(a.error.Type).To(Equal("unauthenticated"))
		Expect(a.error.Message).To(ContainSubstring("bearer token is required"))

		a = h.call(http.MethodGet, "/admin/effective", "not-a-token")
		Expect(a.code).To(Equal(http.StatusUnauthorized))
		Expect(a.error.Message).To(Equal("the bearer token is not valid"))

		a = h.call(http.MethodGet, "/admin/effective", stranger)
		Expect(a.code).To(Equal(http.StatusForbidden))
		Expect(a.error.Type).To(Equal("forbidden"))
		Expect(a.error.Message).To(MatchRegexp(`^user "system:serviceaccount:adminauth-\d+:stranger" may not get /admin/effective$`))

		a = h.call(http.MethodGet, "/admin/effective", reader)
		Expect(a.code).To(Equal(http.StatusOK))
		Expect(a.body).To(Equal("served /admin/effective"))
	})

	DescribeTable("guards every path but the open ones",
		func(method, path string, want int) {
			h := newHarness(10 * time.Second)
			Expect(h.call(method, path, "").code).To(Equal(want))
		},
		Entry("the kubelet's liveness probe is open", http.MethodGet, "/healthz", http.StatusOK),
		Entry("the kubelet's readiness probe is open", http.MethodGet, "/readyz", http.StatusOK),
		Entry("the metrics are open when the guard is told so", http.MethodGet, "/metrics", http.StatusOK),
		Entry("an admin endpoint added later is guarded by construction", http.MethodPost, "/admin/attest", http.StatusUnauthorized),
		Entry("an upstream's probe is guarded", http.MethodPost, "/admin/upstreams/primary/probe", http.StatusUnauthorized),
		Entry("a path outside /admin/ is guarded too", http.MethodGet, "/debug/pprof/", http.StatusUnauthorized),
		Entry("a dot segment does not open an admin path", http.MethodGet, "/healthz/../admin/effective", http.StatusUnauthorized),
		Entry("a trailing slash does not open an admin path", http.MethodGet, "/admin/effective/", http.StatusUnauthorized),
	)

	It("checks the verb: the reader role may get, not post", func() {
		h := newHarness(10 * time.Second)
		reader := serviceAccount("reader", readerRole())
		Expect(h.call(http.MethodGet, "/admin/attest", reader).code).To(Equal(http.StatusOK))
		a := h.call(http.MethodPost, "/admin/attest", reader)
		Expect(a.code).To(Equal(http.StatusForbidden))
		Expect(a.error.Message).To(HaveSuffix("may not post /admin/attest"))
	})

	It("reuses a decision for its time to live: a scrape storm sends no review, and a revoked role holds until the decision expires", func() {
		h := newHarness(10 * time.Second)
		reader := serviceAccount("reader", readerRole())
		stranger := serviceAccount("stranger")

		before := calls.Load()
		Expect(h.call(http.MethodGet, "/admin/effective", reader).code).To(Equal(http.StatusOK))
		Expect(calls.Load()-before).To(Equal(int64(2)), "one TokenReview and one SubjectAccessReview")
		Expect(h.call(http.MethodGet, "/admin/effective", stranger).code).To(Equal(http.StatusForbidden))
		Expect(calls.Load() - before).To(Equal(int64(4)))

		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				defer GinkgoRecover()
				Expect(h.call(http.MethodGet, "/admin/effective", reader).code).To(Equal(http.StatusOK))
				Expect(h.call(http.MethodGet, "/admin/effective", stranger).code).To(Equal(http.StatusForbidden))
			})
		}
		wg.Wait()
		Expect(calls.Load()-before).To(Equal(int64(4)), "every answer came from the cache")

		// Another path is another decision.
		Expect(h.call(http.MethodGet, "/admin/other", reader).code).To(Equal(http.StatusOK))
		Expect(calls.Load() - before).To(Equal(int64(6)))

		h.advance(10 * time.Second)
		Expect(h.call(http.MethodGet, "/admin/effective", reader).code).To(Equal(http.StatusOK))
		Expect(calls.Load()-before).To(Equal(int64(8)), "an expired decision is reviewed again")
	})

	It("keeps at most MaxEntries decisions: a flood of tokens evicts, it does not grow", func() {
		r := adminauth.New(adminauth.Options{
			TokenReviews:         proxy.AuthenticationV1().TokenReviews(),
			SubjectAccessReviews: proxy.AuthorizationV1().SubjectAccessReviews(),
			MaxEntries:           1,
		})
		ctx := context.Background()
		reader := serviceAccount("reader", readerRole())
		stranger := serviceAccount("stranger")
		before := calls.Load()
		Expect(r.Review(ctx, reader, "get", "/admin/effective").Status).To(Equal(http.StatusOK))
		Expect(r.Review(ctx, reader, "get", "/admin/effective").Status).To(Equal(http.StatusOK))
		Expect(calls.Load()-before).To(Equal(int64(2)), "the second answer is cached")
		Expect(r.Review(ctx, stranger, "get", "/admin/effective").Status).To(Equal(http.StatusForbidden))
		Expect(r.Review(ctx, reader, "get", "/admin/effective").Status).To(Equal(http.StatusOK))
		Expect(calls.Load()-before).To(Equal(int64(6)), "the stranger's decision evicted the reader's")
	})

	It("answers 503 without caching when the API server refuses the proxy's reviews", func() {
		ctx := context.Background()
		// The proxy's own identity may not create reviews: a ServiceAccount without
		// system:auth-delegator.
		tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, "default", &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			_, err = admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
			tr, err = admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, "default", &authnv1.TokenRequest{}, metav1.CreateOptions{})
		}
		Expect(err).NotTo(HaveOccurred())
		weak := weakClient(tr.Status.Token)
		r := adminauth.New(adminauth.Options{
			TokenReviews:         weak.AuthenticationV1().TokenReviews(),
			SubjectAccessReviews: weak.AuthorizationV1().SubjectAccessReviews(),
		})
		reader := serviceAccount("reader", readerRole())
		for range 2 {
			d := r.Review(ctx, reader, "get", "/admin/effective")
			Expect(d.Status).To(Equal(http.StatusServiceUnavailable))
			Expect(d.Reason).To(Equal("the proxy cannot review the token with the Kubernetes API server"))
		}
	})
})

var _ = Describe("ParseMode", func() {
	It("reads kubernetes and none, and names both otherwise", func() {
		Expect(adminauth.ParseMode("kubernetes")).To(Equal(adminauth.ModeKubernetes))
		Expect(adminauth.ParseMode("none")).To(Equal(adminauth.ModeNone))
		_, err := adminauth.ParseMode("basic")
		Expect(err).To(MatchError(`want "kubernetes" or "none", got "basic"`))
	})
})
