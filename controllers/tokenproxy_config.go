// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// How the config travels (issue 14). A document of at most config.MaxInline bytes
// stays whole under render.ConfigKey in the fleet's ConfigMap <fleet>-proxy, as it always
// has: most fleets, read with kubectl as before. A larger one (a ConfigMap holds at
// most 1 MiB, about 5,000 keys) is cut into chunks (config.Split), each an immutable
// ConfigMap <fleet>-proxy-<hash of its content> labelled render.ChunkOfLabel, and the fleet's
// ConfigMap holds the manifest that names them. The write order keeps every replica on
// a whole document: the chunks, then the Role that lets the pods get them, then the
// manifest; a replica applies a manifest once it holds every chunk it names. The
// chunks of the previous manifest stay (and readable) until the next change, so a
// replica still reading it is not cut short; older ones are deleted.

// previousChunksAnnotation on the fleet's ConfigMap names the chunks of the document
// before the current one, comma-separated: kept, and readable, until the next change.
const previousChunksAnnotation = "tokenwarden.io/previous-chunks"

// configWrite is what applyConfig wrote.
type configWrite struct {
	generation int64
	// digest is the whole document's (config.Digest), inline or chunked.
	digest string
	// chunks are the chunks of the current and the previous document.
	chunks []string
	// configMapVersion is the fleet's ConfigMap's resourceVersion once written.
	configMapVersion string
}

// applyConfig writes the rendered document, inline or as chunks and a manifest, and
// returns its generation, which grows by one with every change of the document.
func (r *TokenProxyReconciler) applyConfig(ctx context.Context, tp *twv1alpha1.TokenProxy, cfg *config.Config) (configWrite, error) {
	name := proxyName(tp)
	var live corev1.ConfigMap
	err := r.Get(ctx, types.NamespacedName{Namespace: tp.Namespace, Name: name}, &live)
	if err != nil && !apierrors.IsNotFound(err) {
		return configWrite{}, fmt.Errorf("get ConfigMap: %w", err)
	}
	prev, _ := strconv.ParseInt(live.Annotations[generationAnnotation], 10, 64)
	liveDigest, liveChunks := documentOf(&live)
	previous := splitNames(live.Annotations[previousChunksAnnotation])
	var w configWrite
	var data map[string]string
	var current []string
	laid, err := r.layouts.Of(client.ObjectKeyFromObject(tp)).Lay(cfg, name)
	if err != nil {
		return configWrite{}, err
	}
	if laid != nil {
		// A chunked document, laid out from each key's line (tokenproxy_config_layout.go).
		cfg.Generation = prev
		digest, err := laid.Digest(prev)
		if err != nil {
			return configWrite{}, err
		}
		if liveDigest != digest {
			cfg.Generation = prev + 1
			previous = liveChunks
		}
		chunks := laid.Chunks(cfg.Generation)
		m, err := laid.Manifest(cfg.Generation, chunks)
		if err != nil {
			return configWrite{}, err
		}
		for _, c := range chunks {
			if err := r.createChunk(ctx, tp, c); err != nil {
				return configWrite{}, err
			}
		}
		mdoc, err := m.Marshal()
		if err != nil {
			return configWrite{}, err
		}
		w = configWrite{generation: cfg.Generation, digest: m.Digest}
		data = map[string]string{config.ManifestKey: string(mdoc)}
		current = m.Chunks
	} else {
		enc, err := render.NewEncoder(cfg)
		if err != nil {
			return configWrite{}, err
		}
		doc, err := enc.At(prev)
		if err != nil {
			return configWrite{}, err
		}
		digest := config.Digest(doc)
		if liveDigest != digest {
			if doc, err = enc.At(prev + 1); err != nil {
				return configWrite{}, err
			}
			digest = config.Digest(doc)
			previous = liveChunks
		}
		w = configWrite{generation: cfg.Generation, digest: digest}
		if len(doc) <= config.MaxInline {
			data = map[string]string{render.ConfigKey: string(doc)}
		} else {
			chunks, m := config.Split(doc, cfg.Generation, name, config.MaxInline)
			for _, c := range chunks {
				if err := r.createChunk(ctx, tp, render.SplitChunk(c)); err != nil {
					return configWrite{}, err
				}
			}
			mdoc, err := m.Marshal()
			if err != nil {
				return configWrite{}, err
			}
			data = map[string]string{config.ManifestKey: string(mdoc)}
			current = m.Chunks
		}
	}
	previous = slices.DeleteFunc(slices.Clone(previous), func(n string) bool { return slices.Contains(current, n) })
	w.chunks = append(slices.Clone(current), previous...)
	if len(current) > 0 {
		// The pods may get the new chunks before the manifest names them.
		if err := r.applyRole(ctx, tp, w.chunks, true); err != nil {
			return configWrite{}, err
		}
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tp.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, cm, func() error {
		cm.Labels = labels(tp)
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[generationAnnotation] = strconv.FormatInt(w.generation, 10)
		if len(previous) > 0 {
			cm.Annotations[previousChunksAnnotation] = strings.Join(previous, ",")
		} else {
			delete(cm.Annotations, previousChunksAnnotation)
		}
		cm.Data = data
		cm.BinaryData = nil
		return controllerutil.SetControllerReference(tp, cm, r.Scheme())
	}); err != nil {
		return configWrite{}, fmt.Errorf("apply ConfigMap: %w", err)
	}
	w.configMapVersion = cm.ResourceVersion
	if err := r.deleteChunks(ctx, tp, w.chunks); err != nil {
		return configWrite{}, err
	}
	return w, nil
}

// documentOf reads the fleet's ConfigMap as written: the digest of its document and,
// for a manifest, the chunks it names. A manifest that does not parse has digest "".
func documentOf(cm *corev1.ConfigMap) (digest string, chunks []string) {
	if doc, ok := cm.Data[render.ConfigKey]; ok {
		return config.Digest([]byte(doc)), nil
	}
	if mdoc, ok := cm.Data[config.ManifestKey]; ok {
		if m, err := config.ParseManifest([]byte(mdoc)); err == nil {
			return m.Digest, m.Chunks
		}
	}
	return "", nil
}

func splitNames(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// chunkTakenError is a ConfigMap in the way of a config chunk: it has the chunk's name
// but the operator did not write it for this fleet (it is not controlled by the
// TokenProxy, or holds other content).
type chunkTakenError struct {
	namespace, name, fleet string
	owned, sameContent     bool
}

func (e *chunkTakenError) Error() string {
	var why []string
	if !e.owned {
		why = append(why, "is not controlled by TokenProxy "+e.fleet)
	}
	if !e.sameContent {
		why = append(why, "holds other content than the chunk of that name")
	}
	return fmt.Sprintf("ConfigMap %s/%s has the name of a config chunk of this fleet but %s: the operator neither uses nor "+
		"overwrites it, and the fleet keeps its last config until it is deleted or renamed", e.namespace, e.name, strings.Join(why, " and "))
}

// createChunk creates a chunk's immutable ConfigMap, unless it is there: its name is
// its content's. A ConfigMap of that name that this fleet's operator did not write is
// an error (chunkTakenError): neither used, since the pods would be granted reading
// a ConfigMap that is not the fleet's, nor overwritten.
func (r *TokenProxyReconciler) createChunk(ctx context.Context, tp *twv1alpha1.TokenProxy, c render.DocChunk) error {
	var have corev1.ConfigMap
	err := r.Get(ctx, types.NamespacedName{Namespace: tp.Namespace, Name: c.Name}, &have)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get ConfigMap %s: %w", c.Name, err)
	}
	if err == nil {
		return r.checkChunk(tp, &have, c)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: tp.Namespace, Labels: labels(tp)},
		Data:       map[string]string{config.ChunkKey: string(c.Text())},
		Immutable:  ptr.To(true),
	}
	cm.Labels[render.ChunkOfLabel] = proxyName(tp)
	if err := controllerutil.SetControllerReference(tp, cm, r.Scheme()); err != nil {
		return err
	}
	err = r.Create(ctx, cm)
	if apierrors.IsAlreadyExists(err) {
		// The cache holds only the operator's ConfigMaps, and may lag its own creates:
		// the API server tells whose this one is.
		if err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: tp.Namespace, Name: c.Name}, &have); err != nil {
			return fmt.Errorf("get ConfigMap %s: %w", c.Name, err)
		}
		return r.checkChunk(tp, &have, c)
	}
	if err != nil {
		return fmt.Errorf("create config chunk %s: %w", c.Name, err)
	}
	return nil
}

// checkChunk returns nil when have is the chunk c as the operator wrote it for the
// fleet, and a chunkTakenError otherwise.
func (r *TokenProxyReconciler) checkChunk(tp *twv1alpha1.TokenProxy, have *corev1.ConfigMap, c render.DocChunk) error {
	owned := metav1.IsControlledBy(have, tp) && have.Labels[render.ChunkOfLabel] == proxyName(tp)
	same := render.HoldsChunkSum(have, c.Sum)
	if owned && same {
		return nil
	}
	return &chunkTakenError{namespace: tp.Namespace, name: c.Name, fleet: tp.Name, owned: owned, sameContent: same}
}

// deleteChunks deletes the fleet's chunks that keep does not name.
func (r *TokenProxyReconciler) deleteChunks(ctx context.Context, tp *twv1alpha1.TokenProxy, keep []string) error {
	var cms corev1.ConfigMapList
	if err := r.List(ctx, &cms, client.InNamespace(tp.Namespace), client.MatchingLabels{render.ChunkOfLabel: proxyName(tp)}); err != nil {
		return fmt.Errorf("list config chunks: %w", err)
	}
	for i := range cms.Items {
		cm := &cms.Items[i]
		if slices.Contains(keep, cm.Name) || !metav1.IsControlledBy(cm, tp) {
			continue
		}
		if err := r.Delete(ctx, cm); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete config chunk %s: %w", cm.Name, err)
		}
		log.FromContext(ctx).V(1).Info("Deleted a config chunk no manifest names", "configmap", cm.Name)
	}
	return nil
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
// the proxy would refuse it; the outcome is s.cfg.
func (r *TokenProxyReconciler) reconcileConfig(ctx context.Context, s *fleetScope) {
	s.cfg = r.configStep(ctx, s)
}

// configStep is reconcileConfig's outcome.
func (r *TokenProxyReconciler) configStep(ctx context.Context, s *fleetScope) configOutcome {
	tp, g := s.tp, s.gathered
	fleet := client.ObjectKeyFromObject(tp)
	inputs := renderInputs(&g.Fleet)
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
	cfg := render.Render(&g.Fleet)
	r.defaultTracing(cfg, tp)
	render.Ledger(cfg, tp, render.EffectiveLedger(tp, r.DefaultLedger))
	if err := checkRendered(cfg); err != nil {
		out := configOutcome{refused: err}
		r.configs.put(fleet, configMemo{inputs: inputs, outcome: out})
		return out
	}
	w, err := r.applyConfig(ctx, tp, cfg)
	if !s.steps.record(stepConfigMap, err) {
		return configOutcome{}
	}
	out := configOutcome{written: true, generation: w.generation, digest: w.digest, chunks: w.chunks}
	r.configs.put(fleet, configMemo{inputs: inputs, outcome: out, configMapVersion: w.configMapVersion})
	return out
}
