// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/proxy/adminauth"
)

// defaultAdminPort is the proxy container's admin port when its pod does not name one.
const defaultAdminPort = 9090

// replicaFlags are how a command reaches a fleet's replicas' admin API: by
// port-forward to each running pod (the default), or at the addresses given.
type replicaFlags struct {
	fleet      string
	adminAddrs []string
	adminToken string
	timeout    time.Duration
}

func (f *replicaFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.fleet, "fleet", "", "The TokenProxy whose replicas to ask (default: the namespace's only one).")
	cmd.Flags().StringSliceVar(&f.adminAddrs, "admin-addr", nil,
		"Ask the replica whose admin API listens at HOST:PORT (or a URL) instead of port-forwarding to each pod of the fleet; repeat it, or separate addresses with commas, for several replicas.")
	cmd.Flags().StringVar(&f.adminToken, "admin-token", "",
		"The bearer token to present to the replicas' admin API (default: the kubeconfig's own bearer token or exec credential).")
	cmd.Flags().DurationVar(&f.timeout, "admin-timeout", 10*time.Second, "How long to wait for each replica.")
}

// replica is one replica's admin API, reached.
type replica struct {
	// name is the pod's name, or the address given.
	name string
	base string
	// close ends its port-forward.
	close func()
}

// adminClient asks the replicas' admin API with the caller's bearer token.
type adminClient struct {
	http    *http.Client
	replica []replica
	// scoped: a replica answered with only the tenants the caller may read.
	scoped bool
}

// Close ends every port-forward.
func (a *adminClient) Close() {
	for _, r := range a.replica {
		if r.close != nil {
			r.close()
		}
	}
}

// errNoBearer is a kubeconfig user without a bearer token, exec credential or auth
// provider: a client certificate or a password proves nothing to a replica.
var errNoBearer = errors.New("the kubeconfig's user has no bearer token (it authenticates with a client certificate or a password), " +
	"and a replica's admin API takes only a bearer token: pass one with --admin-token, for example " +
	`--admin-token "$(kubectl create token NAME -n NAMESPACE)" for a ServiceAccount bound to ClusterRole tokenwarden-proxy-admin-reader`)

// connect reaches the replicas: at --admin-addr, or by port-forward to each running
// pod of the fleet in namespace ns.
func (o *Options) connect(ctx context.Context, f *replicaFlags, ns string) (*adminClient, error) {
	cfg, err := o.Config.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("read the kubeconfig: %w", err)
	}
	rt, err := bearerTransport(cfg, f.adminToken)
	if err != nil {
		return nil, err
	}
	a := &adminClient{http: &http.Client{Transport: rt, Timeout: f.timeout}}
	if len(f.adminAddrs) > 0 {
		for _, addr := range f.adminAddrs {
			base := addr
			if !strings.Contains(base, "://") {
				base = "http://" + base
			}
			a.replica = append(a.replica, replica{name: addr, base: strings.TrimRight(base, "/")})
		}
		return a, nil
	}
	pods, err := o.fleetPods(ctx, f.fleet, ns)
	if err != nil {
		return nil, err
	}
	if err := o.mayPortForward(ctx, ns); err != nil {
		return nil, err
	}
	for i := range pods {
		r, err := forward(ctx, cfg, &pods[i], f.timeout)
		if err != nil {
			a.Close()
			return nil, err
		}
		a.replica = append(a.replica, r)
	}
	return a, nil
}

// bearerTransport presents token, or the kubeconfig's own bearer credential (a token,
// a token file, an exec plugin's or an auth provider's), on every call.
func bearerTransport(cfg *rest.Config, token string) (http.RoundTripper, error) {
	base := http.DefaultTransport
	if token != "" {
		return &bearer{token: token, next: base}, nil
	}
	if cfg.BearerToken == "" && cfg.BearerTokenFile == "" && cfg.ExecProvider == nil && cfg.AuthProvider == nil {
		return nil, errNoBearer
	}
	// Only the credential: the replicas are not the API server, and are not
	// impersonated.
	c := rest.Config{BearerToken: cfg.BearerToken, BearerTokenFile: cfg.BearerTokenFile, ExecProvider: cfg.ExecProvider, AuthProvider: cfg.AuthProvider,
		AuthConfigPersister: cfg.AuthConfigPersister, Host: cfg.Host}
	rt, err := rest.HTTPWrappersForConfig(&c, base)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig's credential: %w", err)
	}
	return rt, nil
}

// bearer sets one bearer token on every call.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// fleetPods are the running pods of the fleet (the namespace's only TokenProxy when
// fleet is empty).
func (o *Options) fleetPods(ctx context.Context, fleet, ns string) ([]corev1.Pod, error) {
	c, err := o.client()
	if err != nil {
		return nil, err
	}
	where := fmt.Sprintf("in namespace %q", ns)
	if fleet == "" {
		var list twv1alpha1.TokenProxyList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return nil, readError(err, "list", "tokenproxies.tokenwarden.io", where)
		}
		switch len(list.Items) {
		case 0:
			return nil, fmt.Errorf("no TokenProxy %s: name one with --fleet, or a replica's admin address with --admin-addr", where)
		case 1:
			fleet = list.Items[0].Name
		default:
			names := make([]string, 0, len(list.Items))
			for _, tp := range list.Items {
				names = append(names, tp.Name)
			}
			return nil, fmt.Errorf("%d TokenProxies %s (%s): name one with --fleet", len(names), where, strings.Join(names, ", "))
		}
	} else {
		var tp twv1alpha1.TokenProxy
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: fleet}, &tp); err != nil {
			return nil, readError(err, "get", "tokenproxies.tokenwarden.io "+strconv.Quote(fleet), where)
		}
	}
	var pods corev1.PodList
	sel := client.MatchingLabels{"app.kubernetes.io/name": "tokenwarden-proxy", "app.kubernetes.io/instance": fleet}
	if err := c.List(ctx, &pods, client.InNamespace(ns), sel); err != nil {
		return nil, readError(err, "list", "pods", where)
	}
	running := slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil })
	if len(running) == 0 {
		return nil, fmt.Errorf("no replica of TokenProxy %q is running %s (%d pods)", fleet, where, len(pods.Items))
	}
	slices.SortFunc(running, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return running, nil
}

// mayPortForward asks the API server whether the caller may port-forward to the pods
// of ns, so that a refusal is one sentence rather than a failed upgrade.
func (o *Options) mayPortForward(ctx context.Context, ns string) error {
	c, err := o.client()
	if err != nil {
		return err
	}
	review := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: "create", Resource: "pods", Subresource: "portforward"},
	}}
	if err := c.Create(ctx, review); err != nil {
		return readError(err, "create", "selfsubjectaccessreviews.authorization.k8s.io", fmt.Sprintf("in namespace %q", ns))
	}
	if !review.Status.Allowed {
		return fmt.Errorf("forbidden: you may not create pods/portforward in namespace %q, which reaching the replicas' admin API needs; "+
			"ask for a Role that grants it, or reach a replica directly with --admin-addr", ns)
	}
	return nil
}

// forward port-forwards a free local port to the pod's admin port.
func forward(ctx context.Context, cfg *rest.Config, pod *corev1.Pod, timeout time.Duration) (replica, error) {
	port := adminPort(pod)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return replica{}, fmt.Errorf("connect to the API server: %w", err)
	}
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return replica{}, fmt.Errorf("port-forward to pod %s: %w", pod.Name, err)
	}
	u := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return replica{}, fmt.Errorf("port-forward to pod %s: %w", pod.Name, err)
	}
	failed := make(chan error, 1)
	go func() { failed <- fw.ForwardPorts() }()
	stopForward := func() { close(stop) }
	select {
	case <-ready:
	case err := <-failed:
		return replica{}, forwardError(pod, err)
	case <-time.After(timeout):
		stopForward()
		return replica{}, fmt.Errorf("port-forward to pod %s in namespace %q: no answer within %s", pod.Name, pod.Namespace, timeout)
	case <-ctx.Done():
		stopForward()
		return replica{}, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) == 0 {
		stopForward()
		return replica{}, fmt.Errorf("port-forward to pod %s: no local port", pod.Name)
	}
	return replica{name: pod.Name, base: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ports[0].Local))), close: stopForward}, nil
}

// forwardError says in one sentence why a port-forward failed, with the API server's
// words.
func forwardError(pod *corev1.Pod, err error) error {
	msg := apiMessage(err)
	if strings.Contains(msg, "forbidden") {
		return fmt.Errorf("forbidden: you may not port-forward to pod %s in namespace %q (the API server said: %s)", pod.Name, pod.Namespace, msg)
	}
	return fmt.Errorf("cannot port-forward to pod %s in namespace %q: %s; reach a replica directly with --admin-addr", pod.Name, pod.Namespace, msg)
}

// adminPort is the pod's container port named admin.
func adminPort(pod *corev1.Pod) int {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "admin" {
				return int(p.ContainerPort)
			}
		}
	}
	return defaultAdminPort
}

// adminError is a replica's refusal of an admin call, in one sentence.
func adminError(r replica, path string, resp *http.Response, body []byte) error {
	msg := strings.TrimSpace(string(body))
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		return fmt.Errorf("unauthorized: replica %s did not accept the bearer token (%s); pass one it accepts with --admin-token", r.name, msg)
	case http.StatusForbidden:
		return fmt.Errorf("forbidden: replica %s refused GET %s (%s); ask for a binding to ClusterRole tokenwarden-proxy-admin-reader", r.name, path, msg)
	}
	return fmt.Errorf("replica %s: GET %s: %s: %s", r.name, path, resp.Status, msg)
}

// get reads one admin path of one replica into out.
func (a *adminClient) get(ctx context.Context, r replica, path string, q url.Values, out any) error {
	body, err := a.getRaw(ctx, r, path, q)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("replica %s: GET %s: %w", r.name, path, err)
	}
	return nil
}

// getRaw reads one admin path of one replica.
func (a *adminClient) getRaw(ctx context.Context, r replica, path string, q url.Values) ([]byte, error) {
	u := r.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("replica %s: %w", r.name, err)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("replica %s: GET %s: %w", r.name, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("replica %s: GET %s: %w", r.name, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, adminError(r, path, resp, body)
	}
	if resp.Header.Get(adminauth.ScopeHeader) == "tenants" {
		a.scoped = true
	}
	return body, nil
}

// refusedErr reports whether an error is a refusal of the caller (every replica
// answers alike: the first one ends the command).
func refusedErr(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "forbidden: ") || strings.HasPrefix(s, "unauthorized: ")
}
