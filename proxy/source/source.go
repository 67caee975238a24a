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
	// Settle is how long a document that does not parse must stay unchanged before it
	// is delivered (to be refused): a file rewritten in place is empty or cut short
	// until its writer is done, and each write's event reads it again. Default 5s.
	Settle time.Duration
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
	fw := f.watch(apply)
	defer fw.settle.Stop()

	// Events come in bursts (a rename is several); settle briefly before reading.
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	fw.check() // a change between Load and the watch
	tick := time.NewTicker(durationOr(f.Resync, 10*time.Second))
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
			fw.log.Warn("Config file watch error", "path", f.Path, "error", err)
		case <-debounce.C:
			fw.check()
		case <-fw.settle.C:
			fw.check()
		case <-tick.C:
			fw.check()
		}
	}
}

// watch is the state of one Run: the digest last delivered and the document held
// back because it did not parse.
func (f *File) watch(apply ApplyFunc) *fileWatch {
	fw := &fileWatch{f: f, apply: apply, last: f.loaded, log: f.Log,
		wait: durationOr(f.Settle, 5*time.Second), settle: time.NewTimer(time.Hour)}
	fw.settle.Stop()
	if fw.log == nil {
		fw.log = slog.Default()
	}
	if fw.last == "" {
		if data, err := os.ReadFile(f.Path); err == nil {
			fw.last = config.Digest(data)
		}
	}
	return fw
}

// fileWatch delivers each document of the file once, and a document that does not
// parse only once it has stayed the same for wait.
type fileWatch struct {
	f     *File
	apply ApplyFunc
	log   *slog.Logger
	wait  time.Duration
	// last is the digest of the document in force (delivered, or loaded).
	last string
	// held is the digest of a document that did not parse, first read at heldAt;
	// settle fires when it has stayed long enough to be delivered.
	held   string
	heldAt time.Time
	settle *time.Timer
}

// check reads the file and delivers its document if it changed and is whole.
func (fw *fileWatch) check() {
	data, err := os.ReadFile(fw.f.Path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			fw.log.Warn("Could not read the config file", "path", fw.f.Path, "error", err)
		}
		return
	}
	d := config.Digest(data)
	if d == fw.last {
		fw.held = ""
		return
	}
	if fw.unsettled(data, d) {
		return
	}
	fw.held, fw.last = "", d
	_ = fw.apply(data, fw.f.String())
}

// unsettled reports whether a document that does not parse is held back: one a
// writer may still be writing, until it has stayed the same for wait.
func (fw *fileWatch) unsettled(data []byte, d string) bool {
	if _, err := config.Parse(data); err == nil {
		return false
	}
	if d != fw.held {
		fw.held, fw.heldAt = d, time.Now()
		fw.settle.Reset(fw.wait)
		fw.log.Debug("The config file does not parse; reading it again in case it is being written",
			"path", fw.f.Path, "wait", fw.wait)
		return true
	}
	return time.Since(fw.heldAt) < fw.wait
}

// durationOr is d, or def when d is not positive.
func durationOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
