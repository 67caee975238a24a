// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package adminauth guards the proxy's admin API: a caller presents a bearer token,
// the Kubernetes API server says who it is (a TokenReview) and whether it may make
// this call (a SubjectAccessReview for the path and verb as a non-resource URL), and
// the answer is cached briefly. It is how kube-rbac-proxy and controller-runtime's
// metrics filter guard an endpoint. A path that returns per-tenant data may instead be
// served to a caller without that permission, scoped to the tenant namespaces it may
// read (a resource SubjectAccessReview per namespace: Scope).
package adminauth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
)

// Mode selects how the admin API authenticates its callers.
type Mode string

const (
	// ModeKubernetes checks every guarded call with a TokenReview and a
	// SubjectAccessReview.
	ModeKubernetes Mode = "kubernetes"
	// ModeNone serves every call to whoever reaches the admin listener.
	ModeNone Mode = "none"
)

// ParseMode reads a --admin-auth value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeKubernetes, ModeNone:
		return m, nil
	}
	return "", fmt.Errorf("want %q or %q, got %q", ModeKubernetes, ModeNone, s)
}

// Defaults of Options.
const (
	DefaultTTL        = 10 * time.Second
	DefaultMaxEntries = 4096
	// reviewTimeout bounds one round of reviews, whatever the caller's deadline.
	reviewTimeout = 10 * time.Second
)

// Options configure a Reviewer.
type Options struct {
	// TokenReviews and SubjectAccessReviews reach the API server (a clientset's
	// AuthenticationV1().TokenReviews() and AuthorizationV1().SubjectAccessReviews()).
	TokenReviews         authnclient.TokenReviewInterface
	SubjectAccessReviews authzclient.SubjectAccessReviewInterface
	// TTL is how long a decision (allowed, unauthenticated or forbidden) is reused for
	// the same token, verb and path. Default DefaultTTL; an API server error is never
	// cached.
	TTL time.Duration
	// MaxEntries bounds the cache. Default DefaultMaxEntries.
	MaxEntries int
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Fleet is the fleet's namespace, whose readers read the platform's own data and
	// the shared budgets' levels (Scope.Tenant of ""); empty: only a caller that may
	// make the call as a whole reads them.
	Fleet string
	// Registerer receives the package's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Decision is the answer for one token, verb and path.
type Decision struct {
	// Status is http.StatusOK when the call may proceed, else StatusUnauthorized,
	// StatusForbidden or StatusServiceUnavailable (the API server could not answer).
	Status int
	// User is the authenticated user name, when the token was valid.
	User string
	// Reason says why a call is refused, for the caller and the log.
	Reason string
	// Tenants: the call may proceed on a tenant path for the namespaces the caller may
	// read (Scope), not for the whole path.
	Tenants bool
	// user is who the token is, for the reviews of a scoped call.
	user authnv1.UserInfo
}

type entry struct {
	d       Decision
	expires time.Time
}

// Reviewer asks the API server about tokens and caches its answers.
type Reviewer struct {
	o       Options
	mu      sync.Mutex
	cache   map[string]entry
	flight  singleflight.Group
	reviews *prometheus.CounterVec
	results *prometheus.CounterVec
}

// New returns a Reviewer.
func New(o Options) *Reviewer {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Reviewer{
		o:     o,
		cache: map[string]entry{},
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_admin_auth_reviews_total",
			Help: "Reviews the admin API sent to the Kubernetes API server, by kind (token, access) and result (ok, error).",
		}, []string{"review", "result"}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenwarden_admin_auth_requests_total",
			Help: "Calls of the guarded admin API, by answer (allowed, unauthenticated, forbidden, unavailable) and whether the decision came from the cache.",
		}, []string{"result", "cached"}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(r.reviews, r.results)
	}
	return r
}

// Review decides whether the bearer token may make the call verb on path.
func (r *Reviewer) Review(ctx context.Context, token, verb, urlPath string) Decision {
	return r.review1(ctx, token, verb, urlPath, false)
}

// ReviewTenants is Review for a path that returns per-tenant data: a caller that may
// not make the call as a whole, but is authenticated, is allowed with Tenants set,
// to be served what Scope lets it read.
func (r *Reviewer) ReviewTenants(ctx context.Context, token, verb, urlPath string) Decision {
	return r.review1(ctx, token, verb, urlPath, true)
}

// tokenKey keys a token in the cache: its SHA-256, never the token.
func tokenKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func (r *Reviewer) review1(ctx context.Context, token, verb, urlPath string, tenants bool) Decision {
	key := tokenKey(token) + " " + verb + " " + urlPath
	if tenants {
		key += " tenants"
	}
	if d, ok := r.cached(key); ok {
		r.count(d, true)
		return d
	}
	// Concurrent calls with the same token, verb and path share one round of reviews.
	v, _, _ := r.flight.Do(key, func() (any, error) {
		if d, ok := r.cached(key); ok {
			return d, nil
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		d := r.review(ctx, token, verb, urlPath)
		if tenants && d.Status == http.StatusForbidden {
			d = Decision{Status: http.StatusOK, User: d.User, Tenants: true, user: d.user}
		}
		if d.Status != http.StatusServiceUnavailable {
			r.store(key, d)
		}
		return d, nil
	})
	d := v.(Decision)
	r.count(d, false)
	return d
}

func (r *Reviewer) review(ctx context.Context, token, verb, urlPath string) Decision {
	tr, err := r.o.TokenReviews.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		r.reviews.WithLabelValues("token", "error").Inc()
		r.o.Logger.Error("The admin API cannot review a token", "error", err)
		return Decision{Status: http.StatusServiceUnavailable, Reason: "the proxy cannot review the token with the Kubernetes API server"}
	}
	r.reviews.WithLabelValues("token", "ok").Inc()
	if !tr.Status.Authenticated {
		return Decision{Status: http.StatusUnauthorized, Reason: "the bearer token is not valid"}
	}
	u := tr.Status.User
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := r.o.SubjectAccessReviews.Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: urlPath, Verb: verb},
	}}, metav1.CreateOptions{})
	if err != nil {
		r.reviews.WithLabelValues("access", "error").Inc()
		r.o.Logger.Error("The admin API cannot review an access", "user", u.Username, "path", urlPath, "verb", verb, "error", err)
		return Decision{Status: http.StatusServiceUnavailable, User: u.Username, Reason: "the proxy cannot review the access with the Kubernetes API server"}
	}
	r.reviews.WithLabelValues("access", "ok").Inc()
	if !sar.Status.Allowed || sar.Status.Denied {
		return Decision{Status: http.StatusForbidden, User: u.Username, user: u,
			Reason: fmt.Sprintf("user %q may not %s %s", u.Username, verb, urlPath)}
	}
	return Decision{Status: http.StatusOK, User: u.Username}
}

// reviewNamespace asks whether user may read namespace's tenant data: get
// tokenbudgets.tokenwarden.io there. An API server error is not an answer.
func (r *Reviewer) reviewNamespace(ctx context.Context, u authnv1.UserInfo, namespace string) (bool, error) {
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := r.o.SubjectAccessReviews.Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		ResourceAttributes: &authzv1.ResourceAttributes{Namespace: namespace, Verb: "get", Group: TenantGroup, Resource: TenantResource},
	}}, metav1.CreateOptions{})
	if err != nil {
		r.reviews.WithLabelValues("access", "error").Inc()
		r.o.Logger.Error("The admin API cannot review a tenant's access", "user", u.Username, "namespace", namespace, "error", err)
		return false, err
	}
	r.reviews.WithLabelValues("access", "ok").Inc()
	return sar.Status.Allowed && !sar.Status.Denied, nil
}

// ScopeHeader is set to "tenants" on the answer of a tenant path served to a caller
// scoped to the tenants it may read.
const ScopeHeader = "X-Tokenwarden-Admin-Scope"

// The resource whose read in a namespace lets a caller read that tenant's admin data.
const (
	TenantGroup    = "tokenwarden.io"
	TenantResource = "tokenbudgets"
)

// Scope is what one caller of a tenant path may read: everything (it may make the
// call as a whole, or the admin API is not guarded), or the namespaces where it may
// get tokenbudgets. A nil Scope reads everything.
type Scope struct {
	r     *Reviewer
	all   bool
	token string // the token's cache key
	user  authnv1.UserInfo
}

type scopeKey struct{}

// ScopeOf is the Scope of a tenant path's call; nil (everything) outside GuardTenants.
func ScopeOf(ctx context.Context) *Scope {
	s, _ := ctx.Value(scopeKey{}).(*Scope)
	return s
}

// All reports whether the caller may read every namespace's data.
func (s *Scope) All() bool { return s == nil || s.all }

// May reports whether the caller may read the data of namespace (a tenant's, or the
// fleet's for the platform's and the shared budgets'). Each answer is cached for the
// token as the path's are; an API server that does not answer refuses (uncached).
func (s *Scope) May(ctx context.Context, namespace string) bool {
	if s.All() {
		return true
	}
	key := s.token + " namespace " + namespace
	if d, ok := s.r.cached(key); ok {
		return d.Status == http.StatusOK
	}
	v, err, _ := s.r.flight.Do(key, func() (any, error) {
		if d, ok := s.r.cached(key); ok {
			return d.Status == http.StatusOK, nil
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		ok, err := s.r.reviewNamespace(ctx, s.user, namespace)
		if err != nil {
			return false, err
		}
		d := Decision{Status: http.StatusForbidden, User: s.user.Username}
		if ok {
			d.Status = http.StatusOK
		}
		s.r.store(key, d)
		return ok, nil
	})
	return err == nil && v.(bool)
}

// Tenant reports whether the caller may read a tenant's data: tenant is a namespace,
// or "" for the platform's own (the fleet's namespace).
func (s *Scope) Tenant(ctx context.Context, tenant string) bool {
	if s.All() {
		return true
	}
	if tenant == "" {
		tenant = s.r.o.Fleet
		if tenant == "" {
			return false
		}
	}
	return s.May(ctx, tenant)
}

// Readable is the namespaces of namespaces the caller may read, in their order.
func (s *Scope) Readable(ctx context.Context, namespaces []string) []string {
	var out []string
	for _, ns := range namespaces {
		if s.May(ctx, ns) {
			out = append(out, ns)
		}
	}
	return out
}

func (r *Reviewer) cached(key string) (Decision, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.cache[key]
	if !ok {
		return Decision{}, false
	}
	if !r.o.Now().Before(e.expires) {
		delete(r.cache, key)
		return Decision{}, false
	}
	return e.d, true
}

func (r *Reviewer) store(key string, d Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.o.Now()
	if len(r.cache) >= r.o.MaxEntries {
		for k, e := range r.cache {
			if !now.Before(e.expires) {
				delete(r.cache, k)
			}
		}
	}
	// Still full of live entries (many tokens at once): drop any one of them.
	for k := range r.cache {
		if len(r.cache) < r.o.MaxEntries {
			break
		}
		delete(r.cache, k)
	}
	r.cache[key] = entry{d: d, expires: now.Add(r.o.TTL)}
}

func (r *Reviewer) count(d Decision, cached bool) {
	result := "allowed"
	switch d.Status {
	case http.StatusUnauthorized:
		result = "unauthenticated"
	case http.StatusForbidden:
		result = "forbidden"
	case http.StatusServiceUnavailable:
		result = "unavailable"
	}
	c := "false"
	if cached {
		c = "true"
	}
	r.results.WithLabelValues(result, c).Inc()
}

// Guard serves next, asking r about every call except those to the open paths
// (exact paths after cleaning, such as the kubelet's /healthz and /readyz). Whatever
// is not open is guarded, so an endpoint added later is guarded by construction.
func Guard(r *Reviewer, open []string, next http.Handler) http.Handler {
	return GuardTenants(r, open, nil, next)
}

// GuardTenants is Guard, with tenant paths: paths that return per-tenant data, served
// to an authenticated caller that may not make the call as a whole with a Scope
// (ScopeOf) of the namespaces it may read, which the handler filters its answer by.
func GuardTenants(r *Reviewer, open, tenant []string, next http.Handler) http.Handler {
	isOpen := make(map[string]bool, len(open))
	for _, p := range open {
		isOpen[p] = true
	}
	isTenant := make(map[string]bool, len(tenant))
	for _, p := range tenant {
		isTenant[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p := cleanPath(req.URL.Path)
		if isOpen[p] {
			next.ServeHTTP(w, req)
			return
		}
		token, ok := bearer(req)
		if !ok {
			refuse(w, Decision{Status: http.StatusUnauthorized, Reason: "a bearer token is required (Authorization: Bearer TOKEN)"})
			return
		}
		d := r.review1(req.Context(), token, verb(req.Method), p, isTenant[p])
		if d.Status != http.StatusOK {
			// An authenticated user refused is worth a line; anonymous callers, who
			// can send any number of bad tokens, only at debug level.
			level := slog.LevelInfo
			if d.Status == http.StatusUnauthorized {
				level = slog.LevelDebug
			}
			r.o.Logger.Log(req.Context(), level, "Refused an admin call", "path", p, "method", req.Method, "status", d.Status, "user", d.User, "reason", d.Reason)
			refuse(w, d)
			return
		}
		if isTenant[p] {
			if d.Tenants {
				w.Header().Set(ScopeHeader, "tenants")
			}
			sc := &Scope{r: r, all: !d.Tenants, token: tokenKey(token), user: d.user}
			req = req.WithContext(context.WithValue(req.Context(), scopeKey{}, sc))
		}
		next.ServeHTTP(w, req)
	})
}

func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	return path.Clean("/" + p)
}

// bearer reads the token of an "Authorization: Bearer TOKEN" header.
func bearer(req *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(req.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// verb is the Kubernetes verb of an HTTP method, as the API server names the verbs
// of non-resource requests.
func verb(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPost:
		return "post"
	case http.MethodPut:
		return "put"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return strings.ToLower(method)
}

// errorBody is the JSON body of a refused admin call.
type errorBody struct {
	Error struct {
		Code    int    `json:"code"`
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func refuse(w http.ResponseWriter, d Decision) {
	var b errorBody
	b.Error.Code, b.Error.Message = d.Status, d.Reason
	switch d.Status {
	case http.StatusUnauthorized:
		b.Error.Type = "unauthenticated"
		w.Header().Set("WWW-Authenticate", `Bearer realm="tokenwarden-proxy-admin"`)
	case http.StatusForbidden:
		b.Error.Type = "forbidden"
	default:
		b.Error.Type = "unavailable"
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(d.Status)
	_ = json.NewEncoder(w).Encode(b)
}
