// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package source

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ConfigMap is one key of one ConfigMap, watched through the API server: the way a
// proxy pod of a fleet gets the document the operator renders. It needs only get,
// list and watch on that one ConfigMap.
type ConfigMap struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	// Key is the data key that holds the document.
	Key string
	Log *slog.Logger
}

func (c *ConfigMap) String() string {
	return fmt.Sprintf("configmap %s/%s[%s]", c.Namespace, c.Name, c.Key)
}

// Load implements Source.
func (c *ConfigMap) Load(ctx context.Context) ([]byte, error) {
	cm, err := c.Client.CoreV1().ConfigMaps(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", c, err)
	}
	data, ok := cm.Data[c.Key]
	if !ok {
		return nil, fmt.Errorf("%s: the ConfigMap has no key %q", c, c.Key)
	}
	return []byte(data), nil
}

// Run implements Source: an informer on the single ConfigMap (a field selector on its
// name) calls apply with every new version of the document.
func (c *ConfigMap) Run(ctx context.Context, apply ApplyFunc) error {
	log := c.Log
	if log == nil {
		log = slog.Default()
	}
	lw := cache.NewListWatchFromClient(c.Client.CoreV1().RESTClient(), "configmaps", c.Namespace,
		fields.OneTermEqualSelector("metadata.name", c.Name))
	var last string
	deliver := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		data, ok := cm.Data[c.Key]
		if !ok {
			log.Warn("The config ConfigMap has no config key; the config in force stays", "source", c.String())
			return
		}
		if data == last {
			return
		}
		last = data
		_ = apply([]byte(data), c.String())
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
	informer.RunWithContext(ctx)
	return nil
}
