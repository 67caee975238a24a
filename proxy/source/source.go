// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

// Package source delivers config documents to the proxy. Every source feeds the same
// apply function (parse, validate, swap), so the file and the Kubernetes ConfigMap
// behave alike: a bad document is refused and the last good config stays.
package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// ApplyFunc applies one document; origin names where it came from, for logs.
type ApplyFunc func(data []byte, origin string) error

// Source watches one place for config documents.
type Source interface {
	// Load returns the current document once, for the first config.
	Load(ctx context.Context) ([]byte, error)
	// Run calls apply with every changed document until ctx ends.
	Run(ctx context.Context, apply ApplyFunc) error
	// String names the source.
	String() string
}

// File is a config file, reloaded when it changes: in place, by an atomic rename, or
// by a symlink swap (the way Kubernetes updates a mounted ConfigMap).
type File struct {
	Path string
	// Resync re-reads the file this often even without an event, in case one was
	// missed. Default 10s.
	Resync time.Duration
	Log    *slog.Logger

	// loaded is the digest of the document Load returned, so Run delivers a change
	// made between the two.
	loaded string
}

func (f *File) String() string { return "file " + f.Path }

// Load implements Source.
func (f *File) Load(context.Context) ([]byte, error) {
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	f.loaded = config.Digest(data)
	return data, nil
}

// Run implements Source. It watches the file's directory (and, for a symlink, the
// directory it points into), so renames and symlink swaps are seen.
func (f *File) Run(ctx context.Context, apply ApplyFunc) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", f.Path, err)
	}
	defer func() { _ = w.Close() }()
	dir := filepath.Dir(f.Path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	if real, err := filepath.EvalSymlinks(f.Path); err == nil && filepath.Dir(real) != dir {
		_ = w.Add(filepath.Dir(real))
	}
	resync := f.Resync
	if resync <= 0 {
		resync = 10 * time.Second
	}
	log := f.Log
	if log == nil {
		log = slog.Default()
	}

	last := f.loaded
	if last == "" {
		if data, err := os.ReadFile(f.Path); err == nil {
			last = config.Digest(data)
		}
	}
	check := func() {
		data, err := os.ReadFile(f.Path)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				log.Warn("Could not read the config file", "path", f.Path, "error", err)
			}
			return
		}
		d := config.Digest(data)
		if d == last {
			return
		}
		last = d
		_ = apply(data, f.String())
	}

	// Events come in bursts (a rename is several); settle briefly before reading.
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	check() // a change between Load and the watch
	tick := time.NewTicker(resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Create) && ev.Name != f.Path {
				// A new symlink target directory: follow it.
				if real, err := filepath.EvalSymlinks(f.Path); err == nil {
					_ = w.Add(filepath.Dir(real))
				}
			}
			debounce.Reset(20 * time.Millisecond)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			log.Warn("Config file watch error", "path", f.Path, "error", err)
		case <-debounce.C:
			check()
		case <-tick.C:
			check()
		}
	}
}
