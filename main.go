// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Command manager runs the tokenwarden operator: it reconciles TokenProxy, TokenBudget
// and ApiKey resources into the configuration and Deployment of a fleet of proxies.
package main

import (
	"flag"
	"os"
	"runtime/debug"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers"
)

func main() {
	var (
		metricsAddr          string
		probeAddr            string
		pprofAddr            string
		enableLeaderElection bool
		leaderElectionNS     string
		proxyImage           string
		secureMetrics        bool
		statusWrites         float64
		statusWriters        int
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "The address the metrics endpoint binds to. Use 0 to disable it.")
	flag.BoolVar(&secureMetrics, "metrics-secure", true,
		"Serve the metrics endpoint over HTTPS, to callers whose bearer token the API server authenticates (TokenReview) and "+
			"authorizes for GET /metrics (SubjectAccessReview). False serves plain HTTP to anyone.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "The address the health and readiness probes bind to.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "", "The address that serves the Go runtime's profiles (/debug/pprof/), unauthenticated; empty or 0 serves none.")
	flag.BoolVar(&enableLeaderElection, "leader-elect", false, "Enable leader election, so that only one operator replica reconciles at a time.")
	flag.StringVar(&leaderElectionNS, "leader-election-namespace", "", "The namespace of the leader election lease (default: the operator's own namespace).")
	flag.StringVar(&proxyImage, "proxy-image", "tokenwarden:dev", "The proxy image of a TokenProxy that names none.")
	flag.Float64Var(&statusWrites, "status-writes-per-second", controllers.DefaultStatusWritesPerSecond,
		"The most TokenBudget and ApiKey status writes a second, of every fleet together; they never hold up a fleet's config or Deployment.")
	flag.IntVar(&statusWriters, "status-writers", controllers.DefaultStatusWriters, "How many TokenBudget and ApiKey status writes run at once.")
	proxyTracing := controllers.ProxyTracingFlags(flag.CommandLine)
	proxyLedger := controllers.ProxyLedgerFlags(flag.CommandLine)
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")
	if limit, ok := memoryLimit(os.Getenv); ok {
		debug.SetMemoryLimit(limit)
		log.Info("Go memory limit set from the container's", "bytes", limit)
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(twv1alpha1.AddToScheme(scheme))

	// As kubebuilder scaffolds it: HTTPS with a self-signed certificate, and every
	// request authenticated and authorized by the API server.
	metricsOpts := metricsserver.Options{BindAddress: metricsAddr, SecureServing: secureMetrics}
	if secureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controllers.CacheOptions(),
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  probeAddr,
		PprofBindAddress:        pprofAddr,
		LeaderElection:          enableLeaderElection,
		LeaderElectionID:        "tokenwarden-operator.tokenwarden.io",
		LeaderElectionNamespace: leaderElectionNS,
	})
	if err != nil {
		log.Error(err, "Unable to create the manager")
		os.Exit(1)
	}
	defaultTracing, err := proxyTracing()
	if err != nil {
		log.Error(err, "Bad flag")
		os.Exit(2)
	}
	defaultLedger, err := proxyLedger()
	if err != nil {
		log.Error(err, "Bad flag")
		os.Exit(2)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := (&controllers.TokenProxyReconciler{
		Client:         mgr.GetClient(),
		Events:         mgr.GetEventRecorder("tokenwarden"),
		ProxyImage:     proxyImage,
		DefaultTracing: defaultTracing,
		DefaultLedger:  defaultLedger,
		// Statuses have their own workers and rate, apart from the reconciles.
		StatusWritesPerSecond: float32(statusWrites),
		StatusWriters:         statusWriters,
	}).SetupWithManager(ctx, mgr); err != nil {
		log.Error(err, "Unable to set up the TokenProxy controller")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "Unable to set up the health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "Unable to set up the readiness check")
		os.Exit(1)
	}

	log.Info("Starting the manager")
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "The manager stopped with an error")
		os.Exit(1)
	}
}

// memoryLimit is the Go runtime's soft memory limit for a container whose memory limit
// in bytes is in MEMORY_LIMIT_BYTES (the chart sets it from the downward API): 90% of
// it, so the collector runs harder as the heap nears the limit instead of the kernel
// killing the operator while a large fleet's document is rendered. GOMEMLIMIT, when
// set, wins (the runtime reads it itself).
func memoryLimit(getenv func(string) string) (int64, bool) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(getenv("MEMORY_LIMIT_BYTES"), 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n / 10 * 9, true
}
