// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	"k8s.io/client-go/util/csaupgrade"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
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
func (r *TokenProxyReconciler) reconcileWorkload(ctx context.Context, s *fleetScope) {
	tp, ss := s.tp, &s.steps
	ss.record(stepRBAC, r.applyPodIdentity(ctx, tp, s.cfg))
	deploy, err := r.applyDeployment(ctx, tp, s.credentials)
	if !ss.record(stepDeployment, err) {
		deploy = s.deployment
	}
	s.deploy = deploy
	ss.record(stepServices, r.applyServices(ctx, tp))
	ss.record(stepDisruptionBudget, r.applyDisruptionBudget(ctx, tp))
	ss.record(stepNetworkPolicy, r.applyNetworkPolicy(ctx, tp))
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
	env := []corev1.EnvVar{{Name: render.PodNameEnv, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}}
	secretEnv := func(envName string, ref *twv1alpha1.SecretKeyReference) corev1.EnvVar {
		return corev1.EnvVar{Name: envName, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name}, Key: secretKey(*ref)}}}
	}
	for _, u := range tp.Spec.Upstreams {
		if u.CredentialSecretRef != nil {
			env = append(env, secretEnv(render.UpstreamCredentialEnv(u.Name), u.CredentialSecretRef))
		}
	}
	if rs := tp.Spec.Storage.Redis; tp.Spec.Storage.Type == twv1alpha1.StorageRedis && rs != nil && rs.PasswordSecretRef != nil {
		env = append(env, secretEnv(render.RedisPasswordEnv, rs.PasswordSecretRef))
	}
	if rs := tp.Spec.Storage.Redis; tp.Spec.Storage.Type == twv1alpha1.StorageRedis && rs != nil && rs.SentinelPasswordSecretRef != nil {
		env = append(env, secretEnv(render.RedisSentinelPasswordEnv, rs.SentinelPasswordSecretRef))
	}
	if ref := checkPasswordRef(tp); ref != nil {
		env = append(env, secretEnv(render.RedisCheckPasswordEnv, ref))
	}
	ledger := render.EffectiveLedger(tp, r.DefaultLedger)
	if ledger != nil {
		env = append(env, secretEnv(render.LedgerURLEnv, ledger.URLSecretRef))
	}
	if ref := cachePasswordRef(tp); ref != nil {
		env = append(env, secretEnv(render.CacheRedisPasswordEnv, ref))
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
				{Name: "http", ContainerPort: render.ProxyPort, Protocol: corev1.ProtocolTCP},
				{Name: "admin", ContainerPort: render.AdminPort, Protocol: corev1.ProtocolTCP},
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
	if ledger != nil {
		spoolVolume(&t.Spec, ledger)
	}
}

// spoolVolume gives the proxy the emptyDir its ledger spools to, sized at twice the
// spool's bound: a batch is written beside the spool before it is renamed into it.
func spoolVolume(ps *corev1.PodSpec, l *twv1alpha1.LedgerSpec) {
	size := resource.NewQuantity(2*render.LedgerSpoolBytes(l), resource.BinarySI)
	ps.Volumes = append(ps.Volumes, corev1.Volume{Name: render.LedgerSpoolVolume,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: size}}})
	c := &ps.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: render.LedgerSpoolVolume, MountPath: render.LedgerSpoolDir})
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
	defer r.scales.lock(client.ObjectKeyFromObject(tp))()
	want := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: proxyName(tp), Namespace: tp.Namespace, Labels: labels(tp)},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(r.latestReplicas(ctx, tp)),
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
	return proxyDrainDelaySeconds + int64(render.DrainConfig(tp).DrainTimeout()/time.Second) + terminationMarginSeconds
}
