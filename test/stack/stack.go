// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package stack runs the whole system on one machine: a real kube-apiserver and etcd
// (the binaries `make tools` builds into bin/), the CRDs, the operator's manager, the
// fake LLM backend, and one proxy process per replica of a TokenProxy, each watching
// its rendered ConfigMap exactly as a pod would. The demo and the end-to-end suite
// both run on it.
//
// An apply takes effect asynchronously: the operator renders it into the ConfigMap,
// then each proxy applies the ConfigMap on its watch event. Before traffic that
// depends on a change, call WaitEnforced: it returns once every proxy of the fleet
// holds the generation of the config that holds the change.
package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers"
	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/test/fakellm"
	"github.com/tokenwarden/tokenwarden/test/fleetwait"
	"github.com/tokenwarden/tokenwarden/test/testproc"
)

// Options configure a Stack.
type Options struct {
	// Root is the repository root: CRDs from config/crd/bases, tools and the proxy
	// binary from bin/.
	Root string
	// LLMAddr is where the fake backend listens ("127.0.0.1:0" for a free port).
	LLMAddr string
	// Behaviour is the fake backend's behaviour.
	Behaviour fakellm.Behaviour
	// Log receives the control plane's and the operator's logs; nil discards them.
	Log io.Writer
	// ProxyBinary is the proxy to run; default bin/proxy.
	ProxyBinary string
	// UsageInterval, when set, is how often the proxies report their usage
	// (--usage-interval) and the shortest time between two writes of a budget's
	// status.usage; default 15 s each.
	UsageInterval time.Duration
	// APIServerFlags are set on the kube-apiserver, for example a higher
	// max-requests-inflight for a benchmark that writes many objects at once.
	APIServerFlags map[string]string
	// NoOperator leaves the operator to the caller, which runs it as a process of its
	// own (the manager binary, with Kubeconfig), as a pod does.
	NoOperator bool
}

// Stack is a running system.
type Stack struct {
	root        string
	dir         string
	proxyBinary string
	usageEvery  time.Duration
	env         *envtest.Environment
	Config      *rest.Config
	Kubeconfig  string
	// AdminToken is a bearer token allowed to read every proxy's admin API (the
	// ServiceAccount default/proxy-admin-reader, bound to the ClusterRole
	// tokenwarden-proxy-admin-reader of config/rbac): the stack's proxies guard it
	// with --admin-auth=kubernetes, their default with --configmap.
	AdminToken string
	Client     client.Client
	LLM        *fakellm.Server
	LLMURL     string
	llmServer  *http.Server
	cancel     context.CancelFunc

	mu      sync.Mutex
	proxies map[string][]*Proxy // by namespace/name of the TokenProxy
	// asServiceAccount are the fleets whose proxies run as their own ServiceAccount
	// (AsServiceAccount), by namespace/name.
	asServiceAccount map[string]bool
}

// Proxy is one proxy process.
type Proxy struct {
	// Index is the proxy's place in its fleet, from 0.
	Index    int
	URL      string
	AdminURL string
	// adminToken authenticates the stack's reads of the admin API.
	adminToken string
	cmd        *exec.Cmd
	exited     chan struct{}
	LogPath    string
}

// Start brings the system up. Stop tears it down.
func Start(ctx context.Context, o Options) (s *Stack, err error) {
	bin := filepath.Join(o.Root, "bin")
	if o.ProxyBinary == "" {
		o.ProxyBinary = filepath.Join(bin, "proxy")
	}
	for _, tool := range []string{filepath.Join(bin, "kube-apiserver"), filepath.Join(bin, "etcd"), filepath.Join(bin, "kubectl"), o.ProxyBinary} {
		if _, err := os.Stat(tool); err != nil {
			return nil, fmt.Errorf("%s is missing: run `make test-tools build` first", tool)
		}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	dir, err := os.MkdirTemp("", "tokenwarden-stack-")
	if err != nil {
		return nil, err
	}
	st := &Stack{root: o.Root, dir: dir, proxyBinary: o.ProxyBinary, usageEvery: o.UsageInterval, proxies: map[string][]*Proxy{}, asServiceAccount: map[string]bool{}}
	s = st
	defer func() {
		// st: a failed start returns no stack, and stops what it started.
		if err != nil {
			st.Stop()
		}
	}()

	ctrl.SetLogger(zap.New(zap.WriteTo(o.Log)))
	s.env = &envtest.Environment{
		BinaryAssetsDirectory: bin,
		CRDDirectoryPaths:     []string{filepath.Join(o.Root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	for k, v := range o.APIServerFlags {
		s.env.ControlPlane.GetAPIServer().Configure().Set(k, v)
	}
	if s.Config, err = s.env.Start(); err != nil {
		return nil, fmt.Errorf("start the control plane: %w", err)
	}
	user, err := s.env.AddUser(envtest.User{Name: "demo-admin", Groups: []string{"system:masters"}}, s.Config)
	if err != nil {
		return nil, err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	s.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(s.Kubeconfig, kc, 0o600); err != nil {
		return nil, err
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(twv1alpha1.AddToScheme(scheme))
	if s.Client, err = client.New(s.Config, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	if s.AdminToken, err = adminReaderToken(ctx, s.Client, o.Root); err != nil {
		return nil, fmt.Errorf("a token for the proxies' admin API: %w", err)
	}
	if err := installAdmissionPolicies(ctx, s.Client, o.Root); err != nil {
		return nil, fmt.Errorf("the admission policies of config/admission: %w", err)
	}
	if !o.NoOperator {
		if err := s.startOperator(scheme, o.UsageInterval); err != nil {
			return nil, err
		}
	}

	s.LLM = fakellm.New()
	s.LLM.Set(o.Behaviour)
	ln, err := net.Listen("tcp", o.LLMAddr)
	if err != nil {
		return nil, fmt.Errorf("the fake backend cannot listen on %s: %w", o.LLMAddr, err)
	}
	s.LLMURL = "http://" + ln.Addr().String()
	s.llmServer = &http.Server{Handler: s.LLM, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.llmServer.Serve(ln) }()
	return s, nil
}

// startOperator runs the operator's manager in this process until Stop.
func (s *Stack) startOperator(scheme *runtime.Scheme, usageInterval time.Duration) error {
	mgr, err := ctrl.NewManager(s.Config, ctrl.Options{
		Scheme: scheme, Cache: controllers.CacheOptions(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if err := (&controllers.TokenProxyReconciler{
		Client: mgr.GetClient(), Events: mgr.GetEventRecorder("tokenwarden"), ProxyImage: "tokenwarden:dev",
		UsageInterval: usageInterval,
	}).SetupWithManager(mctx, mgr); err != nil {
		return err
	}
	go func() { _ = mgr.Start(mctx) }()
	return nil
}

// adminReaderToken installs the ClusterRole that config/rbac ships for reading the
// proxies' admin API, binds a ServiceAccount to it and returns a token of that
// ServiceAccount, as `kubectl create token` does.
func adminReaderToken(ctx context.Context, c client.Client, root string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "config", "rbac", "proxy_admin_reader_role.yaml"))
	if err != nil {
		return "", err
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(data, role); err != nil {
		return "", err
	}
	role.Name = "tokenwarden-" + role.Name // config/default's prefix
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "proxy-admin-reader"}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "proxy-admin-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name}},
	}
	for _, o := range []client.Object{role, sa, binding} {
		if err := c.Create(ctx, o); err != nil {
			return "", err
		}
	}
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 60 * 60)}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// installAdmissionPolicies creates the ValidatingAdmissionPolicies and bindings of
// config/admission, as config/default installs them with the operator.
func installAdmissionPolicies(ctx context.Context, c client.Client, root string) error {
	files, err := filepath.Glob(filepath.Join(root, "config", "admission", "*_policy*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var o client.Object = &admissionregistrationv1.ValidatingAdmissionPolicy{}
		if strings.HasSuffix(f, "_binding.yaml") {
			o = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		}
		if err := yaml.UnmarshalStrict(data, o); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	if len(files) == 0 {
		return errors.New("none found")
	}
	return nil
}

// AsServiceAccount makes the fleet's proxy processes started from now on talk to the
// API server as the ServiceAccount <name>-proxy that the operator made for its pods,
// with the Role it gave them, as they do in a cluster (the others run as an
// administrator): each with a token bound to a Pod of its replica's name, so that
// the admission policies of config/admission, which the stack installs, let it create
// its report Lease. It waits until the ServiceAccount may read the fleet's ConfigMap.
func (s *Stack) AsServiceAccount(ctx context.Context, namespace, name string) error {
	sa := &corev1.ServiceAccount{}
	if err := poll(ctx, 60*time.Second, func() error {
		return s.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name + "-proxy"}, sa)
	}); err != nil {
		return fmt.Errorf("the operator did not make the ServiceAccount %s/%s-proxy: %w", namespace, name, err)
	}
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 60 * 60)}}
	if err := s.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return err
	}
	// Until the operator has bound the Role, and the API server's authorizer sees it,
	// the proxy cannot read its ConfigMap.
	as := rest.AnonymousClientConfig(s.Config)
	as.BearerToken = tr.Status.Token
	c, err := client.New(as, client.Options{})
	if err != nil {
		return err
	}
	if err := poll(ctx, 60*time.Second, func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name + "-proxy"}, &corev1.ConfigMap{})
	}); err != nil {
		return fmt.Errorf("the ServiceAccount %s/%s-proxy cannot read its ConfigMap: %w", namespace, name, err)
	}
	s.mu.Lock()
	s.asServiceAccount[namespace+"/"+name] = true
	s.mu.Unlock()
	return nil
}

// podKubeconfig writes the kubeconfig of proxy i of a fleet that runs as its
// ServiceAccount: a token bound to a Pod object of the replica's name, as a pod's
// projected token is, whose pod-name claim lets it create its report Lease
// (config/admission). The Pod never runs: there is no kubelet.
func (s *Stack) podKubeconfig(ctx context.Context, namespace, name, replica string) (string, error) {
	sa := name + "-proxy"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: replica},
		Spec: corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "proxy", Image: "tokenwarden:dev"}}}}
	if err := s.Client.Create(ctx, pod); apierrors.IsAlreadyExists(err) {
		err = s.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		if err != nil {
			return "", err
		}
	} else if err != nil {
		return "", fmt.Errorf("the Pod of replica %s: %w", replica, err)
	}
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 60 * 60),
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}
	if err := s.Client.SubResource("token").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: sa}}, tr); err != nil {
		return "", fmt.Errorf("a token of %s/%s bound to Pod %s: %w", namespace, sa, pod.Name, err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["stack"] = &clientcmdapi.Cluster{Server: s.Config.Host, CertificateAuthorityData: s.Config.CAData}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "stack", AuthInfo: "proxy", Namespace: namespace}
	kc.CurrentContext = "proxy"
	path := filepath.Join(s.dir, fmt.Sprintf("kubeconfig-%s-%s", namespace, replica))
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", err
	}
	return path, nil
}

// Kubectl runs bin/kubectl against the stack's API server.
func (s *Stack) Kubectl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(s.root, "bin", "kubectl"), append([]string{"--kubeconfig", s.Kubeconfig}, args...)...)
	cmd.Dir = s.root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Proxies returns the running proxies of a TokenProxy.
func (s *Stack) Proxies(namespace, name string) []*Proxy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Proxy(nil), s.proxies[namespace+"/"+name]...)
}

// SyncProxies runs as many proxy processes as the TokenProxy has replicas, as its
// Deployment would, each watching the fleet's ConfigMap, and waits until they serve.
func (s *Stack) SyncProxies(ctx context.Context, namespace, name string) ([]*Proxy, error) {
	var tp twv1alpha1.TokenProxy
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &tp); err != nil {
		return nil, err
	}
	want := 1
	if tp.Spec.Replicas != nil {
		want = int(*tp.Spec.Replicas)
	}
	// The ConfigMap must exist before a proxy can load it.
	if err := poll(ctx, 60*time.Second, func() error {
		return s.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name + "-proxy"}, &corev1.ConfigMap{})
	}); err != nil {
		return nil, fmt.Errorf("the operator did not render %s/%s-proxy: %w", namespace, name, err)
	}
	key := namespace + "/" + name
	s.mu.Lock()
	running := s.proxies[key]
	s.mu.Unlock()
	for len(running) > want {
		last := running[len(running)-1]
		last.stop()
		running = running[:len(running)-1]
	}
	for i := len(running); i < want; i++ {
		p, err := s.startProxy(ctx, namespace, name, i)
		if err != nil {
			return nil, err
		}
		running = append(running, p)
	}
	s.mu.Lock()
	s.proxies[key] = running
	s.mu.Unlock()
	return append([]*Proxy(nil), running...), nil
}

// startProxy starts replica i of a fleet. Its ports are free when chosen, but any
// process of the host (another suite's redis-server, another proxy) may take one
// before the proxy binds it: a proxy that could not bind is started again on other
// ports.
func (s *Stack) startProxy(ctx context.Context, namespace, name string, i int) (*Proxy, error) {
	for attempt := 1; ; attempt++ {
		p, err := s.startProxyOnce(ctx, namespace, name, i)
		if errors.Is(err, errPortTaken) {
			if attempt < 5 {
				continue
			}
			return nil, fmt.Errorf("proxy %d: %w, %d times", i, err, attempt)
		}
		return p, err
	}
}

// errPortTaken is a proxy that exited because one of its ports was taken.
var errPortTaken = errors.New("a port was taken")

// readyClient asks for /readyz: a port someone else took may accept and never answer.
var readyClient = &http.Client{Timeout: 2 * time.Second}

func (s *Stack) startProxyOnce(ctx context.Context, namespace, name string, i int) (*Proxy, error) {
	port, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	adminPort, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		Index:      i,
		URL:        fmt.Sprintf("http://127.0.0.1:%d", port),
		AdminURL:   fmt.Sprintf("http://127.0.0.1:%d", adminPort),
		adminToken: s.AdminToken,
		LogPath:    filepath.Join(s.dir, fmt.Sprintf("%s-%s-proxy-%d.log", namespace, name, i)),
		exited:     make(chan struct{}),
	}
	logf, err := os.Create(p.LogPath)
	if err != nil {
		return nil, err
	}
	// Every process shares the host name: each reports itself under its own name, as a
	// pod does under its pod name.
	replica := fmt.Sprintf("%s-proxy-%d", name, i)
	kubeconfig := s.Kubeconfig
	s.mu.Lock()
	asSA := s.asServiceAccount[namespace+"/"+name]
	s.mu.Unlock()
	if asSA {
		if kubeconfig, err = s.podKubeconfig(ctx, namespace, name, replica); err != nil {
			_ = logf.Close()
			return nil, err
		}
	}
	args := []string{"--configmap", namespace + "/" + name + "-proxy", "--kubeconfig", kubeconfig,
		"--replica-name", replica,
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", adminPort),
		// No endpoints to drop the pod from here: the drain closes the listener at once.
		"--drain-delay", "0s"}
	if s.usageEvery > 0 {
		args = append(args, "--usage-interval", s.usageEvery.String())
	}
	// Each replica's ledger spool is its own, as each pod's emptyDir is.
	args = append(args, "--ledger-spool-dir", filepath.Join(s.dir, fmt.Sprintf("%s-%s-proxy-%d-ledger-spool", namespace, name, i)))
	env, err := s.podEnv(ctx, namespace, name)
	if err != nil {
		_ = logf.Close()
		return nil, err
	}
	p.cmd = exec.Command(s.proxyBinary, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); _ = logf.Close(); close(p.exited) }()
	if err := poll(ctx, 60*time.Second, func() error {
		select {
		case <-p.exited:
			return errPermanent
		default:
		}
		// Serving is logged once both ports are bound: until then /readyz may be
		// another process's.
		if log, err := os.ReadFile(p.LogPath); err != nil || !bytes.Contains(log, []byte(`"msg":"Serving"`)) {
			return errors.New("not serving yet")
		}
		resp, err := readyClient.Get(p.AdminURL + "/readyz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		p.stop()
		log, _ := os.ReadFile(p.LogPath)
		if errors.Is(err, errPermanent) && bytes.Contains(log, []byte("address already in use")) {
			return nil, errPortTaken
		}
		return nil, fmt.Errorf("proxy %d did not become ready: %w\n%s", i, err, log)
	}
	return p, nil
}

// podEnv is the environment a fleet's pod gets from its Secrets that the stack's
// processes need: the ledger database's URL (spec.ledger.urlSecretRef).
func (s *Stack) podEnv(ctx context.Context, namespace, name string) ([]string, error) {
	var tp twv1alpha1.TokenProxy
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &tp); err != nil {
		return nil, err
	}
	l := tp.Spec.Ledger
	if l == nil || l.Disabled || l.URLSecretRef == nil {
		return nil, nil
	}
	var sec corev1.Secret
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: l.URLSecretRef.Name}, &sec); err != nil {
		return nil, fmt.Errorf("the ledger's Secret of %s/%s: %w", namespace, name, err)
	}
	return []string{render.LedgerURLEnv + "=" + string(sec.Data[l.URLSecretRef.Key])}, nil
}

// Effective is the part of a proxy's /admin/effective the stack reads.
type Effective struct {
	Generation int64 `json:"generation"`
	Divisor    int64 `json:"budget_division_replicas"`
}

// Effective reads the config in force of one proxy.
func (p *Proxy) Effective(ctx context.Context) (Effective, error) {
	var e Effective
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.AdminURL+"/admin/effective", nil)
	if err != nil {
		return e, err
	}
	req.Header.Set("Authorization", "Bearer "+p.adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return e, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return e, fmt.Errorf("GET /admin/effective: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return e, json.NewDecoder(resp.Body).Decode(&e)
}

// String names the proxy in messages: its index in the fleet and its admin URL.
func (p *Proxy) String() string { return fmt.Sprintf("proxy %d (admin %s)", p.Index, p.AdminURL) }

// replica is the proxy as fleetwait reads it.
func (p *Proxy) replica() fleetwait.Replica {
	return fleetwait.Replica{Name: p.String(), Generation: func(ctx context.Context) (int64, error) {
		e, err := p.Effective(ctx)
		return e.Generation, err
	}}
}

// WaitEnforced waits until the fleet enforces its current state and returns the
// generation of its config: the operator has observed the TokenProxy and every
// TokenBudget and ApiKey that references it (fleetwait.Observed), and every proxy
// process of the fleet has applied the generation of the fleet's ConfigMap or a later
// one (/admin/effective). Call it after SyncProxies, and after every apply that the
// next request depends on. On timeout the error names what lagged: the proxy, with
// its admin URL and the generation it has, or the object the operator had not
// observed.
func (s *Stack) WaitEnforced(ctx context.Context, namespace, name string, timeout time.Duration) (int64, error) {
	var tp twv1alpha1.TokenProxy
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &tp); err != nil {
		return 0, err
	}
	want := 1
	if tp.Spec.Replicas != nil {
		want = int(*tp.Spec.Replicas)
	}
	proxies := s.Proxies(namespace, name)
	if len(proxies) != want {
		return 0, fmt.Errorf("TokenProxy %s/%s has %d replicas and %d proxy processes run: call SyncProxies first", namespace, name, want, len(proxies))
	}
	replicas := make([]fleetwait.Replica, len(proxies))
	for i, p := range proxies {
		replicas[i] = p.replica()
	}
	return fleetwait.Wait(ctx, s.Client, namespace, name, replicas, timeout)
}

// CheckDivisor returns nil when every proxy enforces 1/divisor of each budget, and
// otherwise names the first that does not. It reads once: call it after WaitEnforced.
func CheckDivisor(ctx context.Context, proxies []*Proxy, divisor int64) error {
	for _, p := range proxies {
		e, err := p.Effective(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if e.Divisor != divisor {
			return fmt.Errorf("%s enforces 1/%d of each budget, not 1/%d", p, e.Divisor, divisor)
		}
	}
	return nil
}

func (p *Proxy) stop() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

// Stop stops the proxies, the backend, the operator and the control plane.
func (s *Stack) Stop() {
	s.mu.Lock()
	for _, ps := range s.proxies {
		for _, p := range ps {
			p.stop()
		}
	}
	s.proxies = map[string][]*Proxy{}
	s.mu.Unlock()
	if s.llmServer != nil {
		_ = s.llmServer.Close()
	}
	if s.cancel != nil {
		s.cancel()
	}
	if s.env != nil {
		_ = s.env.Stop()
	}
	_ = os.RemoveAll(s.dir)
}

var errPermanent = errors.New("gave up")

// poll calls fn until it succeeds, returns errPermanent, or the timeout passes.
func poll(ctx context.Context, timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil || errors.Is(err, errPermanent) {
			return err
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
