// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// Field indexes.
const (
	// proxyRefField indexes TokenBudgets and ApiKeys by their fleet: "namespace/name".
	proxyRefField = "spec.proxyRef"
)

// TokenProxyReconciler runs one fleet per TokenProxy: it renders the fleet's
// TokenBudgets and ApiKeys into the proxy config ConfigMap, runs the proxy Deployment,
// Service and RBAC, and writes the status of every object it read.
type TokenProxyReconciler struct {
	client.Client
	// Events records what an operator acts on: conflicts and missing Secrets.
	Events events.EventRecorder
	// ProxyImage is the proxy image when a TokenProxy names none.
	ProxyImage string
	// DefaultTracing is the tracing of a fleet whose TokenProxy sets none; nil: off.
	DefaultTracing *twv1alpha1.TracingSpec

	// monitors says whether the cluster serves ServiceMonitors (checked at setup, and
	// again when their CRD appears).
	monitors monitors
	// UsageInterval is the shortest time between two writes of one TokenBudget's
	// status.usage (default DefaultUsageInterval).
	UsageInterval time.Duration

	// renewals tells live replicas by the renewals the operator saw (leases.go).
	renewals renewals
	// keyStatuses memoizes, per fleet (by TokenProxy namespace and name), the inputs of the key
	// statuses found current (keyStatusInputs).
	keyStatuses sync.Map
	// apiReader reads what the cache does not hold: a ConfigMap the operator did not
	// label, in the way of a config chunk (createChunk).
	apiReader client.Reader
	// indexes are the informers' indexes of ApiKeys and their Secrets, read without
	// copies; keyOrders is each fleet's key order (fleet_index.go).
	indexes   indexers
	keyOrders keyOrders
	// configs is each fleet's last config outcome and its inputs (config_memo.go).
	configs configMemos
	// layouts is each fleet's chunked document, key by key (config_layout.go).
	layouts docLayouts
}

// SetupWithManager registers the reconciler, its indexes and its watches.
func (r *TokenProxyReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.apiReader = mgr.GetAPIReader()
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &twv1alpha1.TokenBudget{}, proxyRefField, proxyRefIndex); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &twv1alpha1.ApiKey{}, proxyRefField, proxyRefIndex); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &twv1alpha1.TokenProxy{}, credentialSecretField, credentialSecretNames); err != nil {
		return err
	}
	r.indexes = indexers{keys: indexerOf(ctx, mgr, &twv1alpha1.ApiKey{}), secrets: indexerOf(ctx, mgr, &corev1.Secret{})}
	if r.indexes.keys != nil {
		r.indexes.keySecrets = r.indexes.keys.AddIndexers(keySecretIndexers) == nil
	}
	toProxy := func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: proxyOf(o)}}
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&twv1alpha1.TokenProxy{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&networkingv1.NetworkPolicy{})
	r.monitors.mapper = mgr.GetRESTMapper()
	if r.monitors.served = serviceMonitorInstalled(mgr.GetRESTMapper()); r.monitors.served {
		b = b.Owns(newServiceMonitor())
		r.monitors.started = true
	}
	c, err := b.
		Watches(crdEvents(), handler.EnqueueRequestsFromMapFunc(r.proxiesWantingMonitors),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == serviceMonitorCRD }))).
		Watches(&twv1alpha1.TokenBudget{}, handler.EnqueueRequestsFromMapFunc(toProxy),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&twv1alpha1.ApiKey{}, handler.EnqueueRequestsFromMapFunc(toProxy),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.proxiesOfSecret), builder.WithPredicates(secretChanged())).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.proxiesOfNamespace),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(r.proxyOfLease),
			builder.WithPredicates(leaseReportChanged())).
		Watches(&rbacv1.ClusterRoleBinding{}, handler.EnqueueRequestsFromMapFunc(r.orphanedAuthDelegator),
			builder.WithPredicates(bindingListed())).
		Build(r)
	if err != nil {
		return err
	}
	if err := r.setupUsage(mgr); err != nil {
		return err
	}
	r.monitors.watch = func() error {
		return c.Watch(source.Kind(mgr.GetCache(), client.Object(newServiceMonitor()),
			handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &twv1alpha1.TokenProxy{}, handler.OnlyControllerOwner())))
	}
	return nil
}

// proxiesOfSecret maps a Secret to the fleets whose pods read a credential from it
// and, for a Secret labelled for ApiKeys, to the fleets of the ApiKeys that reference
// it (secret_keys.go). Without that index, such a Secret maps to every fleet that may
// hold an ApiKey of its namespace: the fleets of that namespace and those that accept
// other namespaces.
func (r *TokenProxyReconciler) proxiesOfSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var proxies twv1alpha1.TokenProxyList
	if err := r.List(ctx, &proxies, client.InNamespace(o.GetNamespace()), client.MatchingFields{credentialSecretField: o.GetName()}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, p := range proxies.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
	}
	if o.GetLabels()[twv1alpha1.SecretUsageLabel] != twv1alpha1.SecretUsageAPIKey {
		return out
	}
	if fleets, ok := r.fleetsOfKeySecret(o.GetNamespace(), o.GetName()); ok {
		for _, req := range fleets {
			if !slices.Contains(out, req) {
				out = append(out, req)
			}
		}
		return out
	}
	var all twv1alpha1.TokenProxyList
	if err := r.List(ctx, &all); err != nil {
		return out
	}
	for i := range all.Items {
		p := &all.Items[i]
		if p.Namespace != o.GetNamespace() && p.Spec.AllowedNamespaces.From != twv1alpha1.NamespacesFromAll &&
			p.Spec.AllowedNamespaces.From != twv1alpha1.NamespacesFromSelector {
			continue
		}
		if req := (reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p)}); !slices.Contains(out, req) {
			out = append(out, req)
		}
	}
	return out
}

// Reconcile renders one fleet, runs its objects and writes the status of everything
// it read. Each step runs unless a step it depends on failed; a failed step sets
// Degraded and the request is retried with backoff.
func (r *TokenProxyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var tp twv1alpha1.TokenProxy
	if err := r.Get(ctx, req.NamespacedName, &tp); err != nil {
		if apierrors.IsNotFound(err) {
			// The fleet is gone (its owned objects go with it, its cluster-scoped
			// binding is deleted here); tell the objects that still reference it.
			r.keyStatuses.Delete(req.NamespacedName)
			r.keyOrders.forget(req.NamespacedName)
			r.configs.forget(req.NamespacedName)
			r.layouts.forget(req.NamespacedName)
			if err := r.deleteAuthDelegator(ctx, req.NamespacedName); err != nil {
				return ctrl.Result{}, err
			}
			return ctrl.Result{}, r.markProxyNotFound(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	if !tp.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}

	g, err := r.gather(ctx, &tp)
	if err != nil {
		// Nothing can be rendered from what could not be read; say so.
		return ctrl.Result{}, r.reportUnread(ctx, &tp, err)
	}
	var ss steps
	cfg := r.reconcileConfig(ctx, &tp, g, &ss)
	deploy := r.reconcileWorkload(ctx, &tp, g, cfg, &ss)
	ss.record(stepServiceMonitor, r.applyServiceMonitor(ctx, &tp))
	requeue, err := r.reconcileStatuses(ctx, &tp, g, cfg, deploy, &ss)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := ss.err(); err != nil {
		return ctrl.Result{}, err
	}
	// A live replica's Lease that is not renewed expires then: time-driven work.
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// configOutcome is what the config step left.
type configOutcome struct {
	// written: the ConfigMap holds the rendered document, of this generation and digest.
	written    bool
	generation int64
	digest     string
	// chunks are the chunk ConfigMaps of the current and the previous document, which
	// the proxy's Role lets it get (none when both fit inline).
	chunks []string
	// refused is the proxy's own validation error of a document it would refuse,
	// which is not written (Accepted=False, InvalidConfig; not retried).
	refused error
}

// reconcileConfig renders the fleet's config and writes it to the ConfigMap, unless
// the proxy would refuse it.
func (r *TokenProxyReconciler) reconcileConfig(ctx context.Context, tp *twv1alpha1.TokenProxy, g *gathered, ss *steps) configOutcome {
	fleet := client.ObjectKeyFromObject(tp)
	inputs := renderInputs(&g.fleet)
	if m, ok := r.configs.get(fleet); ok && m.inputs == inputs {
		// The same document as the last reconcile's: refused again, or still written.
		if m.outcome.refused != nil {
			return m.outcome
		}
		if r.configUnchanged(ctx, tp, m) {
			return m.outcome
		}
	}
	r.configs.forget(fleet)
	cfg := render(&g.fleet)
	r.defaultTracing(cfg, tp)
	if err := checkRendered(cfg); err != nil {
		out := configOutcome{refused: err}
		r.configs.put(fleet, configMemo{inputs: inputs, outcome: out})
		return out
	}
	w, err := r.applyConfig(ctx, tp, cfg)
	if !ss.record(stepConfigMap, err) {
		return configOutcome{}
	}
	out := configOutcome{written: true, generation: w.generation, digest: w.digest, chunks: w.chunks}
	r.configs.put(fleet, configMemo{inputs: inputs, outcome: out, configMapVersion: w.configMapVersion})
	return out
}

// reconcileStatuses writes the statuses: the fleet's budgets and keys when the config
// was written (their conditions name its generation), and the TokenProxy's in one
// write. It returns when a replica's report Lease expires.
func (r *TokenProxyReconciler) reconcileStatuses(ctx context.Context, tp *twv1alpha1.TokenProxy, g *gathered, cfg configOutcome,
	deploy *appsv1.Deployment, ss *steps,
) (time.Duration, error) {
	now := time.Now()
	var rs *reports
	if cfg.written {
		var err error
		if rs, err = r.readReports(ctx, tp, now, cfg.generation, cfg.digest); ss.record(stepStatus, err) {
			ss.record(stepStatus, r.writeObjectStatuses(ctx, tp, g, cfg.generation, rs))
		} else {
			rs = nil
		}
	}
	st := r.fleetStatus(tp, g, cfg, deploy, rs, ss)
	// A newly recorded durable epoch goes into the config at once: the next reconcile
	// renders it.
	epochsChanged := !equality.Semantic.DeepEqual(st.DurableEpochs, tp.Status.DurableEpochs)
	if err := r.patchStatus(ctx, tp, &tp.Status, st); err != nil {
		return 0, err
	}
	if rs == nil {
		return 0, nil
	}
	if epochsChanged {
		return time.Millisecond, nil
	}
	return rs.requeue(now), nil
}

// gathered is what one fleet is rendered from, and the verdict on every object read.
type gathered struct {
	fleet
	// allBudgets and allKeys are every object that references the fleet, accepted or
	// not: the ones whose status this reconcile writes.
	allBudgets     []*twv1alpha1.TokenBudget
	allKeys        []keyRead
	budgetVerdicts map[string]verdict // by TokenBudget objectKey
	// credentials are what the pods read from Secrets.
	credentials credentials
	// deployment is the fleet's Deployment as read, nil when there is none.
	deployment *appsv1.Deployment
}

// keyRead is an ApiKey as read, with its verdict and its Secret's fingerprint.
type keyRead struct {
	key         *twv1alpha1.ApiKey
	verdict     verdict
	fingerprint string
}

// verdict is an object's Accepted condition.
type verdict struct {
	accepted bool
	reason   string
	message  string
}

// byObjectKey returns pointers to the items, in the order of their objectKey
// (namespace/name), without making the keys: a fleet of 50,000 keys sorts on every
// reconcile.
func byObjectKey[T any, P interface {
	*T
	client.Object
}](items []T) []P {
	out := make([]P, len(items))
	for i := range items {
		out[i] = P(&items[i])
	}
	slices.SortFunc(out, func(a, b P) int {
		return compareJoined(a.GetNamespace(), a.GetName(), b.GetNamespace(), b.GetName())
	})
	return out
}

// compareJoined compares a1+"/"+a2 with b1+"/"+b2, as strings.Compare would, without
// joining them.
func compareJoined(a1, a2, b1, b2 string) int {
	at := func(s1, s2 string, i int) byte {
		switch {
		case i < len(s1):
			return s1[i]
		case i == len(s1):
			return '/'
		default:
			return s2[i-len(s1)-1]
		}
	}
	la, lb := len(a1)+1+len(a2), len(b1)+1+len(b2)
	for i := range min(la, lb) {
		if ca, cb := at(a1, a2, i), at(b1, b2, i); ca != cb {
			if ca < cb {
				return -1
			}
			return 1
		}
	}
	return cmp.Compare(la, lb)
}

// apiKeySecrets are the Secrets of a namespace labelled for ApiKeys, by name, as the
// cache holds them: not to be written to.
func (r *TokenProxyReconciler) apiKeySecrets(ctx context.Context, namespace string) (map[string]*corev1.Secret, error) {
	var list corev1.SecretList
	if err := r.List(ctx, &list, client.InNamespace(namespace),
		client.MatchingLabels{twv1alpha1.SecretUsageLabel: twv1alpha1.SecretUsageAPIKey}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list the ApiKey Secrets of %s: %w", namespace, err)
	}
	out := make(map[string]*corev1.Secret, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

func (r *TokenProxyReconciler) gather(ctx context.Context, tp *twv1alpha1.TokenProxy) (*gathered, error) {
	g := &gathered{
		fleet:          fleet{proxy: tp},
		budgetVerdicts: map[string]verdict{},
	}
	// The budgets, keys and Secrets are read from the cache without copies: a fleet of
	// 50,000 keys would copy them all on every reconcile. Nothing here writes to them;
	// patchStatus copies the one it writes.
	var budgets twv1alpha1.TokenBudgetList
	if err := r.List(ctx, &budgets, client.MatchingFields{proxyRefField: client.ObjectKeyFromObject(tp).String()},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list TokenBudgets: %w", err)
	}
	allowed := make([]*twv1alpha1.TokenBudget, 0, len(budgets.Items))
	for _, b := range byObjectKey(budgets.Items) {
		if !b.DeletionTimestamp.IsZero() {
			continue
		}
		g.allBudgets = append(g.allBudgets, b)
		v, ok, err := r.namespaceVerdict(ctx, tp, b)
		if err != nil {
			return nil, err
		}
		if !ok {
			g.budgetVerdicts[objectKey(b)] = v
			continue
		}
		allowed = append(allowed, b)
	}
	if err := r.readDeployment(ctx, tp, g); err != nil {
		return nil, err
	}
	// A budget the fleet cannot enforce is not in force, so it conflicts with none.
	enforceable := allowed[:0:0]
	for _, b := range allowed {
		if v, ok := fleetVerdict(tp, b, g.divisor); !ok {
			g.budgetVerdicts[objectKey(b)] = v
			continue
		}
		enforceable = append(enforceable, b)
	}
	winners, losers, conflicted := resolveConflicts(enforceable)
	g.budgets = winners
	for _, b := range winners {
		g.budgetVerdicts[objectKey(b)] = verdict{accepted: true, reason: twv1alpha1.ReasonAccepted, message: "The budget is in force"}
	}
	for _, b := range losers {
		g.budgetVerdicts[objectKey(b)] = verdict{reason: twv1alpha1.ReasonConflicted, message: conflicted[objectKey(b)]}
	}

	keys, err := r.fleetKeys(ctx, tp)
	if err != nil {
		return nil, err
	}
	inForce := verdict{accepted: true, reason: twv1alpha1.ReasonAccepted, message: "The key is in force"}
	secrets := map[string]map[string]*corev1.Secret{} // read through the client: by namespace and name
	g.allKeys = make([]keyRead, 0, len(keys))
	g.keys = make([]keyInput, 0, len(keys))
	for _, k := range keys {
		if !k.DeletionTimestamp.IsZero() {
			continue
		}
		g.allKeys = append(g.allKeys, keyRead{key: k})
		read := &g.allKeys[len(g.allKeys)-1]
		v, ok, err := r.namespaceVerdict(ctx, tp, k)
		if err != nil {
			return nil, err
		}
		if ok {
			v, ok = bypassVerdict(tp, k)
		}
		if !ok {
			read.verdict = v
			continue
		}
		// The cache holds only the Secrets labelled for the operator's use; an ApiKey
		// may use only those labelled for ApiKeys, in its own namespace.
		s, err := r.apiKeySecret(ctx, k.Namespace, k.Spec.SecretRef.Name, secrets)
		if err != nil {
			return nil, err
		}
		if s == nil {
			read.verdict = keySecretNotFound(k)
			continue
		}
		hash := keyHash(s, secretKey(k.Spec.SecretRef))
		if hash == "" {
			read.verdict = verdict{reason: twv1alpha1.ReasonSecretKeyMissing,
				message: fmt.Sprintf("Secret %s has no key %q, or it is empty", k.Spec.SecretRef.Name, secretKey(k.Spec.SecretRef))}
			continue
		}
		g.keys = append(g.keys, keyInput{key: k, hash: hash, read: len(g.allKeys) - 1})
		read.fingerprint = hash[:8]
		read.verdict = inForce
	}
	var lostKeys []keyInput
	g.keys, lostKeys = resolveKeyConflicts(g.keys)
	for _, l := range lostKeys {
		g.allKeys[l.read].verdict = verdict{reason: twv1alpha1.ReasonConflicted, message: l.conflict}
	}

	creds, err := r.readCredentials(ctx, tp)
	if err != nil {
		return nil, err
	}
	g.credentials = creds

	return g, nil
}

// readDeployment reads the fleet's Deployment, if any, and the budget division it
// implies.
func (r *TokenProxyReconciler) readDeployment(ctx context.Context, tp *twv1alpha1.TokenProxy, g *gathered) error {
	var deploy appsv1.Deployment
	err := r.Get(ctx, types.NamespacedName{Namespace: tp.Namespace, Name: proxyName(tp)}, &deploy)
	switch {
	case apierrors.IsNotFound(err):
		g.divisor = divisor(tp, nil)
	case err != nil:
		return fmt.Errorf("get Deployment: %w", err)
	default:
		g.divisor = divisor(tp, &deploy)
		g.deployment = &deploy
	}
	return nil
}

func secretKey(ref twv1alpha1.SecretKeyReference) string {
	if ref.Key == "" {
		return "key"
	}
	return ref.Key
}

// divisor is the budget division: max(desired, current) replicas, so a rolling
// update's surge pods or a scale-down in progress never raise the fleet above its
// total. The desired count is the TokenProxy's, which the Deployment is set to.
func divisor(tp *twv1alpha1.TokenProxy, d *appsv1.Deployment) int64 {
	n := int64(1)
	if tp.Spec.Replicas != nil {
		n = int64(*tp.Spec.Replicas)
	}
	if d != nil {
		if d.Spec.Replicas != nil {
			n = max(n, int64(*d.Spec.Replicas))
		}
		n = max(n, int64(d.Status.Replicas))
	}
	return max(n, 1)
}

// markProxyNotFound sets Accepted=False/ProxyNotFound on the objects that reference a
// fleet that does not exist.
func (r *TokenProxyReconciler) markProxyNotFound(ctx context.Context, name types.NamespacedName) error {
	// An object in another namespace is told the fleet's namespace too.
	notFound := func(o client.Object) string {
		if foreign(o) {
			return fmt.Sprintf("TokenProxy %s not found", name)
		}
		return fmt.Sprintf("TokenProxy %s not found", name.Name)
	}
	var budgets twv1alpha1.TokenBudgetList
	if err := r.List(ctx, &budgets, client.MatchingFields{proxyRefField: name.String()}); err != nil {
		return err
	}
	for i := range budgets.Items {
		b := &budgets.Items[i]
		st := b.Status.DeepCopy()
		st.ObservedGeneration = b.Generation
		st.Replicas, st.PerReplica, st.Storage = 0, twv1alpha1.PerReplicaAllowance{}, ""
		st.Summary = summary(b, false, 1)
		setCondition(&st.Conditions, twv1alpha1.ConditionAccepted, false, twv1alpha1.ReasonProxyNotFound, notFound(b), b.Generation)
		setCondition(&st.Conditions, twv1alpha1.ConditionReady, false, twv1alpha1.ReasonProxyNotFound, notFound(b), b.Generation)
		st.ConfigGeneration = 0
		setCondition(&st.Conditions, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonNotInConfig, "Not in a fleet's config: "+notFound(b), b.Generation)
		if err := r.patchStatus(ctx, b, &b.Status, st); err != nil {
			return err
		}
	}
	var keys twv1alpha1.ApiKeyList
	if err := r.List(ctx, &keys, client.MatchingFields{proxyRefField: name.String()}); err != nil {
		return err
	}
	for i := range keys.Items {
		k := &keys.Items[i]
		st := k.Status.DeepCopy()
		st.ObservedGeneration = k.Generation
		setCondition(&st.Conditions, twv1alpha1.ConditionAccepted, false, twv1alpha1.ReasonProxyNotFound, notFound(k), k.Generation)
		setCondition(&st.Conditions, twv1alpha1.ConditionReady, false, twv1alpha1.ReasonProxyNotFound, notFound(k), k.Generation)
		st.ConfigGeneration = 0
		setCondition(&st.Conditions, twv1alpha1.ConditionEnforced, false, twv1alpha1.ReasonNotInConfig, "Not in a fleet's config: "+notFound(k), k.Generation)
		if err := r.patchStatus(ctx, k, &k.Status, st); err != nil {
			return err
		}
	}
	log.FromContext(ctx).V(1).Info("TokenProxy not found; marked its references", "budgets", len(budgets.Items), "keys", len(keys.Items))
	return nil
}

// proxyName is the name of the fleet's owned objects.
func proxyName(tp *twv1alpha1.TokenProxy) string { return tp.Name + "-proxy" }
