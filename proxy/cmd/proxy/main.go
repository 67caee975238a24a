// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Command proxy is tokenwarden's data plane: it keeps LLM traffic inside token budgets.
//
//	proxy --config FILE                serve, reloading FILE when it changes
//	proxy --configmap NAMESPACE/NAME   serve the document the operator renders, reloading on watch events
//	proxy validate FILE                check a document: errors name the field, warnings are printed
//
// The admin listener's /admin/ API (the config in force, and what later issues add)
// is guarded by --admin-auth: "kubernetes" reviews each caller's bearer token with the
// API server (the default with --configmap), "none" serves whoever reaches the
// listener (the default with --config, whose admin_listen defaults to 127.0.0.1).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	adminapi "github.com/tokenwarden/tokenwarden/proxy/admin"
	"github.com/tokenwarden/tokenwarden/proxy/adminauth"
	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/budget/redisstore"
	"github.com/tokenwarden/tokenwarden/proxy/config"
	"github.com/tokenwarden/tokenwarden/proxy/ledger"
	"github.com/tokenwarden/tokenwarden/proxy/metrics"
	"github.com/tokenwarden/tokenwarden/proxy/report"
	"github.com/tokenwarden/tokenwarden/proxy/server"
	"github.com/tokenwarden/tokenwarden/proxy/settlement"
	"github.com/tokenwarden/tokenwarden/proxy/source"
	"github.com/tokenwarden/tokenwarden/proxy/telemetry"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "validate" {
		os.Exit(validate(os.Args[2:], os.Stdout, os.Stderr))
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		os.Exit(1)
	}
}

// validate checks documents without serving: exit 0 when valid (warnings printed),
// 1 naming every invalid field, 2 on usage errors.
func validate(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: proxy validate FILE...")
		return 2
	}
	code := 0
	for _, path := range args {
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", path, err)
			code = 1
			continue
		}
		cfg, err := config.Parse(data)
		if err != nil {
			fmt.Fprintf(stderr, "%s: invalid:\n", path)
			for _, line := range splitErrors(err) {
				fmt.Fprintf(stderr, "  %s\n", line)
			}
			code = 1
			continue
		}
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(stdout, "%s: warning: %s\n", path, w)
		}
		fmt.Fprintf(stdout, "%s: valid\n", path)
	}
	return code
}

func splitErrors(err error) []string {
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, e.Error())
		}
		return out
	}
	return []string{err.Error()}
}

func run(args []string) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	configPath := fs.String("config", "", "The config document to serve; reloaded when it changes.")
	configMap := fs.String("configmap", "", "NAMESPACE/NAME of the ConfigMap that holds the config document, or the manifest of a large one's chunks (manifest.yaml); reloaded on watch events.")
	configMapKey := fs.String("configmap-key", "proxy.yaml", "The ConfigMap data key that holds the document.")
	kubeconfig := fs.String("kubeconfig", "", "Kubeconfig for --configmap outside a cluster (default: in-cluster, then $KUBECONFIG).")
	listen := fs.String("listen", "", "Override the document's listen address (for several proxies on one machine).")
	adminListen := fs.String("admin-listen", "", "Override the document's admin_listen address.")
	ledgerSpool := fs.String("ledger-spool-dir", "", "Override the document's ledger.spool_dir (for several proxies on one machine, each with a spool of its own).")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error.")
	drainDelay := fs.Duration("drain-delay", 5*time.Second, "On SIGTERM, how long /readyz answers 503 before the listener closes, for the endpoints to drop the pod.")
	drainTimeout := fs.Duration("drain-timeout", 0, "On SIGTERM, how long requests and streams in flight may take to finish (default: the largest upstream timeout, at most 10m).")
	adminAuth := fs.String("admin-auth", "",
		"How the admin API authenticates its callers: kubernetes (a TokenReview and a SubjectAccessReview per bearer token, cached) or none. Default: kubernetes with --configmap, none with --config.")
	adminAuthMetrics := fs.Bool("admin-auth-metrics", false, "With --admin-auth=kubernetes: guard /metrics too (the scraper then needs a bearer token allowed to get /metrics).")
	adminAuthTTL := fs.Duration("admin-auth-cache-ttl", adminauth.DefaultTTL, "With --admin-auth=kubernetes: how long a review's answer is reused for the same token, verb and path.")
	fleetNamespace := fs.String("fleet-namespace", "",
		"With --admin-auth=kubernetes: the fleet's namespace, whose readers (get tokenbudgets there) read the platform's own admin data and the shared budgets' levels (default: the --configmap's namespace).")
	replicaName := fs.String("replica-name", defaultReplicaName(),
		"With --configmap: this replica's name in its report Lease <configmap>-<name> (default: $POD_NAME, else the host name). Unique within the fleet.")
	usageEvery := fs.Duration("usage-interval", report.DefaultUsageEvery,
		"With --configmap: how often this replica scans its budgets for the usage report its Lease carries (the operator writes it into each TokenBudget's status.usage).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	var (
		src   source.Source
		lease *report.Lease
		cs    kubernetes.Interface
	)
	if *configPath != "" && *configMap != "" {
		return errors.New("--config and --configmap are exclusive")
	}
	authMode, err := adminAuthMode(*adminAuth, *configMap != "")
	if err != nil {
		return err
	}
	if *configMap != "" || authMode == adminauth.ModeKubernetes {
		if cs, err = kubeClient(*kubeconfig); err != nil {
			return err
		}
	}
	switch {
	case *configPath != "":
		src = &source.File{Path: *configPath, Log: log}
	case *configMap != "":
		ns, name, ok := strings.Cut(*configMap, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("--configmap: want NAMESPACE/NAME, got %q", *configMap)
		}
		src = &source.ConfigMap{Client: cs, Namespace: ns, Name: name, Key: *configMapKey, Log: log}
		if *fleetNamespace == "" {
			*fleetNamespace = ns
		}
		if *replicaName == "" {
			return errors.New("--replica-name: empty, and neither $POD_NAME nor the host name is set")
		}
		lease = &report.Lease{Client: cs, Namespace: ns, ConfigMap: name, Replica: *replicaName, Log: log}
	default:
		return errors.New("a config source is required: --config FILE or --configmap NAMESPACE/NAME")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	data, err := src.Load(ctx)
	if err != nil {
		return err
	}
	first, err := config.Parse(data)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	clock := budget.SystemClock{}
	var epochChanged func()
	if lease != nil {
		epochChanged = lease.Changed
	}
	store, mem, err := newStore(first, clock, m, log, epochChanged)
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }()
	if rs, ok := store.(*redisstore.Store); ok && lease != nil {
		// The fleet's durable epochs, for the operator to record and to fence on.
		lease.Epochs = func() string {
			b, _ := json.Marshal(rs.Epochs())
			return string(b)
		}
	}
	// The listeners and the store are built once, from the first document and the
	// flags; a reload that changes them is reported as restart_required.
	listenAddr, adminAddr := first.Listen, first.AdminListen
	var overridden []string
	if *listen != "" {
		listenAddr = *listen
		overridden = append(overridden, "listen")
	}
	if *adminListen != "" {
		adminAddr = *adminListen
		overridden = append(overridden, "admin_listen")
	}
	refusals := &report.Refusals{}
	if lease != nil {
		lease.UsageEvery = *usageEvery
		lease.Usage = usageReport(store, mem, refusals, *usageEvery)
	}
	// Tracing is set up from the first document (and the OTEL_* environment); a
	// change of it is reported as restart_required.
	var tp *sdktrace.TracerProvider
	if t := &first.Observability.Tracing; telemetry.Enabled(t) {
		if tp, err = telemetry.NewTracerProvider(ctx, t, ""); err != nil {
			return err
		}
		log.Info("Tracing", "protocol", telemetry.Protocol(t))
		defer func() {
			stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(stop); err != nil {
				log.Warn("Some spans were not exported before stopping", "error", err)
			}
		}()
	}
	// The spend ledger, one observer of settlements (its Add never blocks).
	ledgerDoc := first
	if *ledgerSpool != "" {
		c := *first
		c.Ledger.SpoolDir = *ledgerSpool
		ledgerDoc = &c
	}
	spend, err := openLedger(ledgerDoc, *configPath, ledgerReplica(fs, *replicaName, *configMap != ""), reg, log)
	if err != nil {
		return err
	}
	var observers []settlement.Observer
	if spend != nil {
		defer spend.close(log) // after serve has drained every request
		observers = append(observers, &ledger.Observer{Ledger: spend.Ledger, Fleet: first.Ledger.Fleet})
		if lease != nil {
			lease.Ledger = func() string { return spend.State().Encode() }
		}
	}
	// A store that makes a network call settles what waits for it off the request's
	// goroutine.
	srvOpts := server.Options{Store: store, Memory: mem, Metrics: m, Clock: clock, Logger: log, AsyncSettle: store != budget.Store(mem),
		Started: first, Overridden: overridden, Refusals: refusals, AccessLogBuffer: first.Observability.AccessLog.Buffer(), Observers: observers,
		LedgerAttests: lease != nil && attestsFromLedger(spend, store)}
	if tp != nil {
		srvOpts.TracerProvider = tp
	}
	if rs, ok := store.(*redisstore.Store); ok {
		// The billing cooldowns are the fleet's: one replica learns, the others read.
		srvOpts.HealthBoard = rs.Board()
	}
	srv := server.New(srvOpts)
	defer func() {
		flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.FlushAccessLog(flush)
	}()
	if lease != nil {
		// The model registry's upstreams' health, for the TokenProxy's status.
		lease.Health = srv.HealthReport
	}
	// applied tells the control plane which config this replica enforces (with
	// --configmap): after each applied document, not only on the Lease's heartbeat.
	attester := ledgerAttester(spend, store, srv, first.Ledger.Fleet, reg, log)
	fallback := ledgerFallback(spend, store, first, reg, log)
	applied := func(cfg *config.Config, data []byte) {
		if fallback != nil {
			fallback.SetReplicas(cfg.Divisor())
		}
		if lease != nil {
			lease.Applied(cfg.Generation, config.Digest(data))
		}
		if attester != nil {
			attester.Order(cfg.RateLimiting.Redis.LedgerAttestation)
		}
	}
	if attester != nil {
		go attester.Run(ctx)
	}
	cfg, err := srv.Apply(data, src.String())
	if err != nil {
		return err
	}
	applied(cfg, data)
	leaseDone := make(chan struct{})
	if lease != nil {
		go func() { defer close(leaseDone); lease.Run(ctx) }()
	} else {
		close(leaseDone)
	}
	// The Lease is deleted when ctx ends; wait for that before the process exits.
	defer func() { <-leaseDone }()

	apply := func(data []byte, origin string) error {
		cfg, err := srv.Apply(data, origin)
		if err == nil {
			applyChecks(store, cfg, log)
			applied(cfg, data)
		}
		return err
	}
	go func() {
		if err := src.Run(ctx, apply); err != nil {
			log.Error("The config source stopped; the config in force stays", "source", src.String(), "error", err)
		}
	}()
	go sweep(ctx, mem, m)
	go srv.RunHealth(ctx, server.DefaultHealthEvery)

	lnData, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	lnAdmin, err := net.Listen("tcp", adminAddr)
	if err != nil {
		return fmt.Errorf("admin_listen: %w", err)
	}
	admin := srv.AdminHandler(reg)
	if spend != nil {
		admin = spend.withReports(admin)
	}
	switch authMode {
	case adminauth.ModeKubernetes:
		open := []string{"/healthz", "/readyz"}
		if !*adminAuthMetrics {
			open = append(open, "/metrics")
		}
		tenant := append(slices.Clone(adminapi.TenantPaths), ledger.ReportPath)
		admin = adminauth.GuardTenants(adminauth.New(adminauth.Options{
			TokenReviews: cs.AuthenticationV1().TokenReviews(), SubjectAccessReviews: cs.AuthorizationV1().SubjectAccessReviews(),
			TTL: *adminAuthTTL, Fleet: *fleetNamespace, Registerer: reg, Logger: log,
		}), open, tenant, admin)
	case adminauth.ModeNone:
		if !loopback(lnAdmin.Addr()) {
			log.Warn("The admin API is served to whoever reaches the admin listener: --admin-auth=none on an address that is not loopback",
				"admin_listen", lnAdmin.Addr().String())
		}
	}
	log.Info("Serving", "listen", lnData.Addr().String(), "admin_listen", lnAdmin.Addr().String(), "admin_auth", string(authMode), "source", src.String())
	return serve(ctx, log, srv, admin, lnData, lnAdmin, drainOptions{delay: *drainDelay, timeout: *drainTimeout})
}

// adminAuthMode resolves --admin-auth: kubernetes by default with --configmap (in a
// cluster, where the admin port is reachable from other pods), none with --config
// (standalone, where admin_listen defaults to 127.0.0.1).
func adminAuthMode(flagValue string, withConfigMap bool) (adminauth.Mode, error) {
	if flagValue == "" {
		if withConfigMap {
			return adminauth.ModeKubernetes, nil
		}
		return adminauth.ModeNone, nil
	}
	m, err := adminauth.ParseMode(flagValue)
	if err != nil {
		return "", fmt.Errorf("--admin-auth: %w", err)
	}
	return m, nil
}

// loopback tells whether a listener's address is reachable only from this machine.
func loopback(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsLoopback()
}

// defaultReplicaName is $POD_NAME (the downward API), else the host name, which is
// the pod's name in a pod.
func defaultReplicaName() string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	n, _ := os.Hostname()
	return n
}

// kubeClient connects to the API server: the given kubeconfig, else the in-cluster
// config, else $KUBECONFIG and the default kubeconfig.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "tokenwarden-proxy"
	return kubernetes.NewForConfig(cfg)
}

// newStore builds the store the config selects. The store is built at start; a reload
// that changes rate_limiting.storage or how it reaches Redis takes effect at the next
// restart (the server reports it as restart_required), and one that changes
// fallback_to_memory at once.
func newStore(c *config.Config, clock budget.Clock, rec budget.Recorder, log *slog.Logger, epochChanged func()) (budget.Store, *budget.Memory, error) {
	rl := &c.RateLimiting
	mem := budget.NewMemory(clock, rl.MaxBuckets)
	if rl.Storage != config.StorageRedis {
		return mem, mem, nil
	}
	var password string
	if rl.Redis.PasswordEnv != "" {
		v, ok := os.LookupEnv(rl.Redis.PasswordEnv)
		if !ok {
			return nil, nil, fmt.Errorf("rate_limiting.redis.password_env: the environment variable %s is not set", rl.Redis.PasswordEnv)
		}
		password = v
	}
	var sentinelPassword string
	if rl.Redis.SentinelPasswordEnv != "" {
		v, ok := os.LookupEnv(rl.Redis.SentinelPasswordEnv)
		if !ok {
			return nil, nil, fmt.Errorf("rate_limiting.redis.sentinel_password_env: the environment variable %s is not set", rl.Redis.SentinelPasswordEnv)
		}
		sentinelPassword = v
	}
	checks, err := checkOptions(&rl.Redis.Checks)
	if err != nil {
		return nil, nil, err
	}
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	opts := redisstore.Options{Checks: checks,
		URL: rl.Redis.URL, Password: password, SentinelPassword: sentinelPassword, LeaseFraction: rl.Redis.HotBudgetSlice, Prefix: rl.Redis.KeyPrefix, Epoch: rl.Redis.Epoch,
		DialTimeout: ms(rl.Redis.DialTimeoutMillis), ReadTimeout: ms(rl.Redis.ReadTimeoutMillis), WriteTimeout: ms(rl.Redis.WriteTimeoutMillis),
		Clock: clock, Recorder: rec, Logger: log, EpochChanged: epochChanged,
	}
	if *rl.Redis.FallbackToMemory {
		opts.Fallback = mem
	}
	s, err := redisstore.New(opts)
	return s, mem, err
}

// checkOptions are the store checks a config document sets, with the check
// credential's password read from its environment variable.
func checkOptions(c *config.RedisChecks) (redisstore.CheckOptions, error) {
	o := redisstore.CheckOptions{Mode: c.Mode, Interval: time.Duration(c.IntervalSeconds) * time.Second, Username: c.Username}
	if env := c.PasswordEnv; env != "" {
		v, ok := os.LookupEnv(env)
		if !ok {
			return o, fmt.Errorf("rate_limiting.redis.checks.password_env: the environment variable %s is not set", env)
		}
		o.Password = v
	}
	return o, nil
}

// applyChecks puts a reloaded document's store checks in force on a Redis store; a
// check credential whose variable is unset keeps the checks in force, and is logged.
func applyChecks(store budget.Store, cfg *config.Config, log *slog.Logger) {
	rs, ok := store.(*redisstore.Store)
	if !ok || cfg.RateLimiting.Storage != config.StorageRedis {
		return
	}
	o, err := checkOptions(&cfg.RateLimiting.Redis.Checks)
	if err == nil {
		err = rs.SetChecks(o)
	}
	if err != nil {
		log.Error("The reloaded store checks are not applied; the checks in force stay", "error", err)
	}
}

// usageReport builds the replica's usage report: from the shared buckets when the
// store is shared (every replica then reports the fleet's whole use), from the
// replica's memory otherwise or while the shared store cannot be read.
func usageReport(store budget.Store, mem *budget.Memory, refusals *report.Refusals, every time.Duration) func(context.Context) (string, error) {
	s := &report.Summarizer{Levels: mem, Refusals: refusals, Every: every}
	if l, ok := store.(budget.Leveler); ok && store != budget.Store(mem) {
		s.Levels, s.Shared, s.Fallback = l, true, mem
	}
	return func(ctx context.Context) (string, error) {
		u, err := s.Summary(ctx)
		if err != nil {
			return "", err
		}
		return u.Encode(), nil
	}
}

// sweep drops refilled buckets (an absent bucket is a full one) and publishes the
// bucket counts.
func sweep(ctx context.Context, mem *budget.Memory, m *metrics.Metrics) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			mem.Sweep()
			for d := budget.Dimension(0); d < budget.NumDimensions; d++ {
				for k := budget.Kind(0); k < budget.Calendar; k++ { // calendar counters live only in Redis
					m.BucketsInUse.WithLabelValues(d.String(), k.String()).Set(float64(mem.LenOf(d, k)))
				}
			}
			// The buckets of client-supplied values, a rule's, bounded apart.
			m.BucketsInUse.WithLabelValues("attribute_values", budget.Rolling.String()).Set(float64(mem.ValueBuckets()))
		}
	}
}
