// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// ConfigMap is one key of one ConfigMap, watched through the API server: the way a
// proxy pod of a fleet gets the document the operator renders. The ConfigMap holds
// the document under Key, or, for a document too large for one ConfigMap, a
// config.Manifest under config.ManifestKey that names the immutable chunk ConfigMaps
// of the same namespace the document is cut into (proxy/config: Split). It needs get,
// list and watch on that one ConfigMap and get on the chunks its manifests name.
type ConfigMap struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	// Key is the data key that holds the document.
	Key string
	Log *slog.Logger
	// Retry is the first wait before the chunks of a manifest are fetched again when
	// one is missing (the operator writes them before the manifest, but a read may
	// race its write or its Role); it doubles up to 30s. Default 1s.
	Retry time.Duration

	mu sync.Mutex
	// chunks are the chunks fetched, by name; a name never changes content, so each is
	// fetched once, and those no manifest names any longer are dropped.
	chunks map[string][]byte
	// loaded is the digest of the document Load returned, so Run does not apply it again.
	loaded string
}

func (c *ConfigMap) String() string {
	return fmt.Sprintf("configmap %s/%s[%s]", c.Namespace, c.Name, c.Key)
}

// errNoDocument is a ConfigMap with neither the document nor a manifest: waiting does
// not help, the next version may.
var errNoDocument = errors.New("the ConfigMap has neither the config key nor " + config.ManifestKey)

// Load implements Source. A manifest whose chunks are not all there yet is read again
// until they are, or until ctx ends.
func (c *ConfigMap) Load(ctx context.Context) ([]byte, error) {
	cm, err := c.Client.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", c, err)
	}
	for attempt := 0; ; attempt++ {
		doc, err := c.document(ctx, cm)
		if err == nil {
			c.loaded = config.Digest(doc)
			return doc, nil
		}
		if !errors.Is(err, config.ErrChunkMissing) {
			return nil, fmt.Errorf("%s: %w", c, err)
		}
		c.log().Info("Waiting for the chunks of the config", "source", c.String(), "error", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w", c, err)
		case <-time.After(c.backoff(attempt)):
		}
		if cm, err = c.Client.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("get %s: %w", c, err)
		}
	}
}

// document is the document a version of the ConfigMap holds: its config key, or the
// chunks its manifest names put back together. An error wrapping
// config.ErrChunkMissing is worth a retry.
func (c *ConfigMap) document(ctx context.Context, cm *corev1.ConfigMap) ([]byte, error) {
	if data, ok := cm.Data[c.Key]; ok {
		return []byte(data), nil
	}
	mdata, ok := cm.Data[config.ManifestKey]
	if !ok {
		return nil, errNoDocument
	}
	m, err := config.ParseManifest([]byte(mdata))
	if err != nil {
		return nil, err
	}
	return c.assemble(ctx, m)
}

// assemble fetches the manifest's chunks it does not hold and puts them together.
func (c *ConfigMap) assemble(ctx context.Context, m *config.Manifest) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chunks == nil {
		c.chunks = map[string][]byte{}
	}
	for _, name := range m.Chunks {
		if _, ok := c.chunks[name]; ok {
			continue
		}
		// A Get, not a watch: the proxy's Role names each chunk it may read.
		cm, err := c.Client.CoreV1().ConfigMaps(c.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("%w: get %s: %w", config.ErrChunkMissing, name, err)
		}
		data, ok := cm.Data[config.ChunkKey]
		if !ok || !config.ChunkMatches(name, []byte(data)) {
			return nil, fmt.Errorf("%w: ConfigMap %s holds no chunk of that name under %q", config.ErrChunkMissing, name, config.ChunkKey)
		}
		c.chunks[name] = []byte(data)
	}
	doc, err := m.Assemble(func(name string) ([]byte, bool) { d, ok := c.chunks[name]; return d, ok })
	if err != nil {
		return nil, err
	}
	for name := range c.chunks {
		if !slices.Contains(m.Chunks, name) {
			delete(c.chunks, name)
		}
	}
	return doc, nil
}

func (c *ConfigMap) backoff(attempt int) time.Duration {
	d := c.Retry
	if d <= 0 {
		d = time.Second
	}
	for range min(attempt, 10) {
		d *= 2
	}
	return min(d, 30*time.Second)
}

func (c *ConfigMap) log() *slog.Logger {
	if c.Log == nil {
		return slog.Default()
	}
	return c.Log
}

// Run implements Source: an informer on the single ConfigMap (a field selector on its
// name) hands every new version to a worker that calls apply with its document. The
// worker applies a manifest's document only once it holds every chunk and the
// document has the manifest's digest; until then it fetches the missing chunks again
// with backoff, and a newer version of the ConfigMap replaces the one it waits on.
func (c *ConfigMap) Run(ctx context.Context, apply ApplyFunc) error {
	log := c.log()
	sel := fields.OneTermEqualSelector("metadata.name", c.Name).String()
	cms := c.Client.CoreV1().ConfigMaps(c.Namespace)
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return cms.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return cms.Watch(ctx, o)
		},
	}, c.Client) // a client without streaming lists (the fake) says so
	// latest holds the newest version not yet taken by the worker.
	latest := make(chan *corev1.ConfigMap, 1)
	deliver := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok || cm.Name != c.Name {
			return
		}
		select {
		case <-latest:
		default:
		}
		latest <- cm
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.ConfigMap{},
		ResyncPeriod:  10 * time.Minute,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    deliver,
			UpdateFunc: func(_, obj any) { deliver(obj) },
			DeleteFunc: func(any) {
				log.Warn("The config ConfigMap was deleted; the config in force stays", "source", c.String())
			},
		},
	})
	done := make(chan struct{})
	go func() { defer close(done); c.work(ctx, latest, apply) }()
	informer.RunWithContext(ctx)
	<-done
	return nil
}

// work applies the documents of the versions it takes from latest.
func (c *ConfigMap) work(ctx context.Context, latest <-chan *corev1.ConfigMap, apply ApplyFunc) {
	log := c.log()
	last := c.loaded
	for {
		var cm *corev1.ConfigMap
		select {
		case <-ctx.Done():
			return
		case cm = <-latest:
		}
		for attempt := 0; cm != nil; attempt++ {
			if m, err := manifestOf(cm); err == nil && m.Digest == last {
				break // a resync of the manifest in force: nothing to fetch
			}
			doc, err := c.document(ctx, cm)
			if err == nil {
				if d := config.Digest(doc); d != last {
					last = d
					_ = apply(doc, c.String())
				}
				break
			}
			if !errors.Is(err, config.ErrChunkMissing) {
				log.Warn("The config ConfigMap holds no usable document; the config in force stays", "source", c.String(), "error", err)
				break
			}
			log.Debug("Waiting for the chunks of the config; the config in force stays", "source", c.String(), "error", err)
			select {
			case <-ctx.Done():
				return
			case newer := <-latest:
				cm, attempt = newer, -1
			case <-time.After(c.backoff(attempt)):
			}
		}
	}
}

// manifestOf is a version's manifest, or an error when it holds none.
func manifestOf(cm *corev1.ConfigMap) (*config.Manifest, error) {
	mdata, ok := cm.Data[config.ManifestKey]
	if !ok {
		return nil, errNoDocument
	}
	return config.ParseManifest([]byte(mdata))
}
