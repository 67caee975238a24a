// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/util/csaupgrade"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// generationAnnotation on the ConfigMap records the rendered config's generation.
const generationAnnotation = twv1alpha1.ConfigGenerationAnnotation

func labels(tp *twv1alpha1.TokenProxy) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "tokenwarden-proxy",
		"app.kubernetes.io/instance":   tp.Name,
		"app.kubernetes.io/managed-by": "tokenwarden",
	}
}

func selectorLabels(tp *twv1alpha1.TokenProxy) map[string]string {
	return map[string]string{"app.kubernetes.io/name": "tokenwarden-proxy", "app.kubernetes.io/instance": tp.Name}
}

// reconcileWorkload runs the fleet: its ServiceAccount and Role (read its own
// ConfigMap, nothing else), the Deployment, the client and admin Services and the
// PodDisruptionBudget, each step whatever the others did. It returns the Deployment
// as applied, or as read when applying it failed (nil when there is none).
func (r *TokenProxyReconciler) reconcileWorkload(ctx context.Context, tp *twv1alpha1.TokenProxy, g *gathered, cfg configOutcome, ss *steps) *appsv1.Deployment {
	ss.record(stepRBAC, r.applyPodIdentity(ctx, tp, cfg))
	deploy, err := r.applyDeployment(ctx, tp, g.credentials)
	if !ss.record(stepDeployment, err) {
		deploy = g.deployment
	}
	ss.record(stepServices, r.applyServices(ctx, tp))
	ss.record(stepDisruptionBudget, r.applyDisruptionBudget(ctx, tp))
	ss.record(stepNetworkPolicy, r.applyNetworkPolicy(ctx, tp))
	return deploy
}

// applyPodIdentity runs the pods' ServiceAccount and the Role that lets them read
// their own ConfigMap (and its chunks) and write their report Leases.
func (r *TokenProxyReconciler) applyPodIdentity(ctx context.Context, tp *twv1alpha1.TokenProxy, cfg configOutcome) error {
	name := proxyName(tp)
	own := func(o client.Object) error { return controllerutil.SetControllerReference(tp, o, r.Scheme()) }

	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tp.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, sa, func() error {
		sa.Labels = labels(tp)
		return own(sa)
	}); err != nil {
		return fmt.Errorf("apply ServiceAccount: %w", err)
	}
	var chunks []string
	if cfg.written {
		chunks = cfg.chunks
	}
	if err := r.applyRole(ctx, tp, chunks, cfg.written); err != nil {
		return err
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tp.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, rb, func() error {
		rb.Labels = labels(tp)
		rb.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}
		rb.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: tp.Namespace}}
		return own(rb)
	}); err != nil {
		return fmt.Errorf("apply RoleBinding: %w", err)
	}
	// The pods' identity may ask the API server who calls their admin endpoints.
	return r.applyAuthDelegator(ctx, tp)
}

// applyRole runs the Role of the fleet's pods: get, list and watch on their
// ConfigMap, get on the chunks named (the current and the previous manifest's: see
// applyConfig), and their report Leases. Unless known, the chunks it names already
// are kept.
func (r *TokenProxyReconciler) applyRole(ctx context.Context, tp *twv1alpha1.TokenProxy, chunks []string, known bool) error {
	name := proxyName(tp)
	var leases coordinationv1.LeaseList
	if err := r.List(ctx, &leases, client.InNamespace(tp.Namespace),
		client.MatchingLabels{twv1alpha1.ReplicaConfigMapLabel: name}); err != nil {
		return fmt.Errorf("list report Leases: %w", err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tp.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, role, func() error {
		if !known {
			chunks = nil
			for _, rule := range role.Rules {
				if slices.Equal(rule.Resources, []string{"configmaps"}) && slices.Equal(rule.Verbs, []string{"get"}) {
					chunks = rule.ResourceNames
				}
			}
		}
		role.Labels = labels(tp)
		role.Rules = []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{name},
			Verbs: []string{"get", "list", "watch"},
		}}
		if len(chunks) > 0 {
			// The chunks of a large fleet's config, by name: the proxy gets each one
			// its manifest names, and no other ConfigMap.
			role.Rules = append(role.Rules, rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: slices.Sorted(slices.Values(chunks)),
				Verbs: []string{"get"},
			})
		}
		role.Rules = append(role.Rules, rbacv1.PolicyRule{
			// Each replica creates its report Lease (proxy/report). Its name holds the
			// pod's name, unknown here, and RBAC cannot limit create by name.
			APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"create"},
		})
		// Renewing and deleting are granted by name, for the report Leases the fleet's
		// replicas created: a proxy cannot touch another Lease of its namespace (a
		// leader election's, say). The proxy never reads a Lease: it creates, then
		// patches.
		if names := reportLeaseNames(leases.Items, name); len(names) > 0 {
			role.Rules = append(role.Rules, rbacv1.PolicyRule{
				APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: names,
				Verbs: []string{"patch", "delete"},
			})
		}
		return controllerutil.SetControllerReference(tp, role, r.Scheme())
	}); err != nil {
		return fmt.Errorf("apply Role: %w", err)
	}
	return nil
}

// reportLeaseNames are the names of the fleet's report Leases, sorted: Leases with the
// fleet's ConfigMap label whose name is the ConfigMap's followed by a replica's.
func reportLeaseNames(leases []coordinationv1.Lease, configMap string) []string {
	var names []string
	for _, le := range leases {
		if strings.HasPrefix(le.Name, configMap+"-") && le.DeletionTimestamp.IsZero() {
			names = append(names, le.Name)
		}
	}
	slices.Sort(names)
	return names
}

// authDelegatorRole is the built-in ClusterRole that lets its subjects create
// TokenReviews and SubjectAccessReviews, and nothing else.
const authDelegatorRole = "system:auth-delegator"

// authDelegatorPrefix begins the name of every fleet's auth-delegator binding.
const authDelegatorPrefix = "tokenwarden-proxy:"

// authDelegatorBinding names the ClusterRoleBinding of a fleet's ServiceAccount to
// system:auth-delegator.
func authDelegatorBinding(fleet types.NamespacedName) string {
	return authDelegatorPrefix + fleet.Namespace + ":" + fleet.Name
}

// fleetOfAuthDelegator is the fleet an auth-delegator binding was made for, read
// from its name (neither a namespace nor a TokenProxy name holds a colon).
func fleetOfAuthDelegator(name string) (types.NamespacedName, bool) {
	rest, ok := strings.CutPrefix(name, authDelegatorPrefix)
	if !ok {
		return types.NamespacedName{}, false
	}
	ns, fleet, ok := strings.Cut(rest, ":")
	if !ok || ns == "" || fleet == "" || strings.Contains(fleet, ":") {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: ns, Name: fleet}, true
}

// orphanedAuthDelegator maps a binding whose TokenProxy is gone to its fleet, whose
// reconcile then deletes it (the NotFound path). The cache lists every labelled
// binding when the manager starts and again on each resync, so a TokenProxy deleted
// while the operator was not running loses its binding then. A fleet that exists
// keeps its binding through its own reconciles.
func (r *TokenProxyReconciler) orphanedAuthDelegator(ctx context.Context, o client.Object) []reconcile.Request {
	fleet, ok := fleetOfAuthDelegator(o.GetName())
	if !ok {
		return nil
	}
	if err := r.Get(ctx, fleet, &twv1alpha1.TokenProxy{}); !apierrors.IsNotFound(err) {
		return nil
	}
	log.FromContext(ctx).V(1).Info("ClusterRoleBinding of a TokenProxy that is gone", "binding", o.GetName(), "fleet", fleet)
	return []reconcile.Request{{NamespacedName: fleet}}
}

// bindingListed passes a binding the cache adds (every one when the manager starts)
// or lists again on a resync (an update that changes nothing); not a change or a
// deletion.
func bindingListed() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetResourceVersion() == e.ObjectNew.GetResourceVersion()
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// applyAuthDelegator lets the fleet's ServiceAccount review the bearer tokens of its
// admin API's callers (proxy/adminauth: a TokenReview, then a SubjectAccessReview),
// reviews being cluster-scoped: a ClusterRoleBinding to system:auth-delegator. A
// cluster-scoped object cannot be owned by a namespaced one, so it is applied (server
// side, no cache of every ClusterRoleBinding) and deleted with the TokenProxy by
// deleteAuthDelegator, or later by the sweep of orphanedAuthDelegator.
func (r *TokenProxyReconciler) applyAuthDelegator(ctx context.Context, tp *twv1alpha1.TokenProxy) error {
	// An unchanged fleet sends no write: the binding in the cache already says it all.
	var have rbacv1.ClusterRoleBinding
	err := r.Get(ctx, client.ObjectKey{Name: authDelegatorBinding(client.ObjectKeyFromObject(tp))}, &have)
	if err == nil && have.RoleRef.Kind == "ClusterRole" && have.RoleRef.Name == authDelegatorRole &&
		len(have.Subjects) == 1 && have.Subjects[0].Kind == rbacv1.ServiceAccountKind &&
		have.Subjects[0].Namespace == tp.Namespace && have.Subjects[0].Name == proxyName(tp) &&
		have.Labels[fleetNamespaceLabel] == tp.Namespace {
		return nil
	}
	ac := rbacv1ac.ClusterRoleBinding(authDelegatorBinding(client.ObjectKeyFromObject(tp))).
		WithLabels(labels(tp)).WithLabels(map[string]string{fleetNamespaceLabel: tp.Namespace}).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(authDelegatorRole)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithNamespace(tp.Namespace).WithName(proxyName(tp)))
	if err := r.Apply(ctx, ac, client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply ClusterRoleBinding %s: %w", authDelegatorBinding(client.ObjectKeyFromObject(tp)), err)
	}
	return nil
}

// fleetNamespaceLabel on a fleet's cluster-scoped objects names its namespace.
const fleetNamespaceLabel = "tokenwarden.io/fleet-namespace"

// deleteAuthDelegator deletes the ClusterRoleBinding of a fleet that is gone.
func (r *TokenProxyReconciler) deleteAuthDelegator(ctx context.Context, fleet types.NamespacedName) error {
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: authDelegatorBinding(fleet)}}
	if err := r.Delete(ctx, crb); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ClusterRoleBinding %s: %w", crb.Name, err)
	}
	return nil
}

// podTemplate fills in the proxy pod: the proxy watching its ConfigMap, probes on the
// admin port, provider credentials from Secrets as environment variables.
func (r *TokenProxyReconciler) podTemplate(tp *twv1alpha1.TokenProxy, t *corev1.PodTemplateSpec) {
	name := proxyName(tp)
	t.Labels = maps.Clone(tp.Spec.PodLabels)
	if t.Labels == nil {
		t.Labels = map[string]string{}
	}
	maps.Copy(t.Labels, selectorLabels(tp)) // the selector's labels win
	t.Annotations = maps.Clone(tp.Spec.PodAnnotations)
	image := tp.Spec.Image
	if image == "" {
		image = r.ProxyImage
	}
	// The replica reports itself in the Lease <ConfigMap>-<pod name> (proxy/report), the
	// only report Lease its pod-bound token may create (config/admission): the pod's
	// name, not the host name, which the kubelet cuts to 63 characters.
	env := []corev1.EnvVar{{Name: podNameEnv, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}}
	secretEnv := func(envName string, ref *twv1alpha1.SecretKeyReference) corev1.EnvVar {
		return corev1.EnvVar{Name: envName, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name}, Key: secretKey(*ref)}}}
	}
	for _, u := range tp.Spec.Upstreams {
		if u.CredentialSecretRef != nil {
			env = append(env, secretEnv(upstreamCredentialEnv(u.Name), u.CredentialSecretRef))
		}
	}
	if rs := tp.Spec.Storage.Redis; tp.Spec.Storage.Type == twv1alpha1.StorageRedis && rs != nil && rs.PasswordSecretRef != nil {
		env = append(env, secretEnv(redisPasswordEnv, rs.PasswordSecretRef))
	}
	if rs := tp.Spec.Storage.Redis; tp.Spec.Storage.Type == twv1alpha1.StorageRedis && rs != nil && rs.SentinelPasswordSecretRef != nil {
		env = append(env, secretEnv(redisSentinelPasswordEnv, rs.SentinelPasswordSecretRef))
	}
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("admin")}},
			PeriodSeconds: 5, TimeoutSeconds: 2, FailureThreshold: 3}
	}
	t.Spec = corev1.PodSpec{
		ServiceAccountName:            name,
		TerminationGracePeriodSeconds: ptr.To(terminationGraceSeconds(tp)),
		NodeSelector:                  maps.Clone(tp.Spec.NodeSelector),
		Tolerations:                   tp.Spec.Tolerations,
		Affinity:                      tp.Spec.Affinity.DeepCopy(),
		TopologySpreadConstraints:     spreadConstraints(tp),
		ImagePullSecrets:              slices.Clone(tp.Spec.ImagePullSecrets),
		SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		Containers: []corev1.Container{{
			Name:  "proxy",
			Image: image,
			Args:  []string{"--configmap", tp.Namespace + "/" + name},
			Env:   env,
			Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: proxyPort, Protocol: corev1.ProtocolTCP},
				{Name: "admin", ContainerPort: adminPort, Protocol: corev1.ProtocolTCP},
			},
			ReadinessProbe: probe("/readyz"),
			LivenessProbe:  probe("/healthz"),
			Resources:      proxyResources(tp.Spec.Resources),
			SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			},
		}},
	}
}

// spreadConstraints are spec.topologySpreadConstraints, each without a labelSelector
// given the pods' selector labels.
func spreadConstraints(tp *twv1alpha1.TokenProxy) []corev1.TopologySpreadConstraint {
	if len(tp.Spec.TopologySpreadConstraints) == 0 {
		return nil
	}
	out := make([]corev1.TopologySpreadConstraint, 0, len(tp.Spec.TopologySpreadConstraints))
	for _, c := range tp.Spec.TopologySpreadConstraints {
		c = *c.DeepCopy()
		if c.LabelSelector == nil {
			c.LabelSelector = &metav1.LabelSelector{MatchLabels: selectorLabels(tp)}
		}
		out = append(out, c)
	}
	return out
}

// fieldManager is the operator's name in the managedFields of what it applies.
const fieldManager = "tokenwarden"

// applyDeployment applies the fields of the fleet's Deployment that the operator owns
// with server-side apply, as the field manager "tokenwarden" (forcing ownership of
// those fields only). Fields it does not set stay with their managers: the
// kubectl.kubernetes.io/restartedAt annotation of `kubectl rollout restart`, another
// controller's annotations or sidecars. When the fields it owns already hold what it
// would apply, nothing is sent.
//
// The pod template carries the hash of the credentials the pods read, so a rotation
// rolls them; while a credential is missing the hash in force is kept.
func (r *TokenProxyReconciler) applyDeployment(ctx context.Context, tp *twv1alpha1.TokenProxy, creds credentials) (*appsv1.Deployment, error) {
	want := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: proxyName(tp), Namespace: tp.Namespace, Labels: labels(tp)},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(ptr.Deref(tp.Spec.Replicas, 1)),
			Selector: &metav1.LabelSelector{MatchLabels: selectorLabels(tp)},
		},
	}
	r.podTemplate(tp, &want.Spec.Template)
	if err := controllerutil.SetControllerReference(tp, want, r.Scheme()); err != nil {
		return nil, err
	}
	var live appsv1.Deployment
	err := r.Get(ctx, client.ObjectKeyFromObject(want), &live)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	if err == nil {
		if c := metav1.GetControllerOf(&live); c != nil && c.UID != tp.UID {
			return nil, fmt.Errorf("deployment %s is controlled by %s %s, not by this TokenProxy", live.Name, c.Kind, c.Name)
		}
	}
	exists := err == nil
	hash := creds.hash
	if inForce, ok := live.Spec.Template.Annotations[credentialsAnnotation]; ok && len(creds.missing) > 0 {
		hash = inForce
	}
	if hash != "" {
		if want.Spec.Template.Annotations == nil {
			want.Spec.Template.Annotations = map[string]string{}
		}
		want.Spec.Template.Annotations[credentialsAnnotation] = hash
	}
	ac := &appsv1ac.DeploymentApplyConfiguration{}
	if err := convertJSON(want, ac); err != nil {
		return nil, err
	}
	// The typed Deployment always serializes these structs; empty, they set nothing.
	ac.Status, ac.Spec.Strategy = nil, nil

	if exists {
		if err := r.upgradeFieldManagers(ctx, &live); err != nil {
			return nil, err
		}
		owned, err := appsv1ac.ExtractDeployment(&live, fieldManager)
		if err == nil && equality.Semantic.DeepEqual(owned, ac) {
			return &live, nil
		}
	}
	if err := r.Apply(ctx, ac, client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return nil, err
	}
	var applied appsv1.Deployment
	if err := convertJSON(ac, &applied); err != nil {
		return nil, err
	}
	return &applied, nil
}

// legacyFieldManagers are the names under which releases before server-side apply
// updated the Deployment: the operator binary's name, which the API server takes from
// its user agent.
var legacyFieldManagers = sets.New("manager")

// upgradeFieldManagers hands the fields an earlier release owned by update to the
// field manager "tokenwarden", once, so that a field the operator stops setting (an
// environment variable of a removed credential, an annotation) is removed by the
// next apply instead of staying with a manager that no longer exists.
func (r *TokenProxyReconciler) upgradeFieldManagers(ctx context.Context, live *appsv1.Deployment) error {
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(live, legacyFieldManagers, fieldManager)
	if err != nil || patch == nil {
		return err
	}
	if err := r.Patch(ctx, live, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		return fmt.Errorf("hand the Deployment's fields to %s: %w", fieldManager, err)
	}
	return nil
}

// convertJSON copies one representation of an object into another through its JSON.
func convertJSON(from, to any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, to)
}

// Termination of a proxy pod: on SIGTERM the proxy fails /readyz for its drain delay
// (its --drain-delay, default 5 s), then waits for the requests and streams in flight
// for at most config.DrainTimeout of its upstreams; the margin covers settling.
const (
	proxyDrainDelaySeconds   = 5
	terminationMarginSeconds = 10
)

// terminationGraceSeconds lets a stopping proxy finish its drain before the kubelet
// kills it: an upstream with a capacity adds the longest queue wait of any class to its
// timeout.
func terminationGraceSeconds(tp *twv1alpha1.TokenProxy) int64 {
	return proxyDrainDelaySeconds + int64(drainConfig(tp).DrainTimeout()/time.Second) + terminationMarginSeconds
}
