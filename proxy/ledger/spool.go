// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// spool holds the batches not yet applied, in sequence order, within a bound in
// bytes. With a directory (the pod's emptyDir) each batch is a file there, and so is
// the replica's identity with its next sequence: a restarted process finds both and
// replays what is left under the keys it was given. Without one it holds them in
// memory. Files are renamed into place, never synced: the spool has to survive the
// process, not the node (a node's loss is the pod's, and a new pod is a new replica).
type spool struct {
	dir string
	max int64

	mu      sync.Mutex
	pending []spooled
	bytes   int64
	replica string
	next    int64
	corrupt int
	// lost is what the replica could not record, kept with its identity.
	lost unrecorded
}

type spooled struct {
	b    *Batch
	size int64
}

// identity is the replica's name in the spool directory, and what it could not
// record: a restarted process reports the gap its ledger has, not nothing.
type identity struct {
	Replica    string     `json:"replica"`
	NextSeq    int64      `json:"next_seq"`
	Unrecorded unrecorded `json:"unrecorded"`
}

// unrecorded sums the batches a replica dropped for want of spool room, and those
// it set aside unreplayed as too old.
type unrecorded struct {
	Dropped Dropped `json:"dropped"`
	Expired Dropped `json:"expired"`
}

const identityFile = "identity.json"

// openSpool opens (or starts) the spool in dir for the pod: it keeps the identity a
// process of the same pod wrote there, or makes one from the pod's name and now.
func openSpool(dir, pod string, maxBytes int64, now time.Time) (*spool, error) {
	s := &spool{dir: dir, max: maxBytes, next: 1, replica: fmt.Sprintf("%s@%d", pod, now.UnixMilli())}
	if dir == "" {
		return s, nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("ledger spool: %w", err)
	}
	var id identity
	raw, err := os.ReadFile(filepath.Join(dir, identityFile))
	switch {
	case err == nil && json.Unmarshal(raw, &id) == nil && strings.HasPrefix(id.Replica, pod+"@") && id.NextSeq > 0:
		s.replica, s.next, s.lost = id.Replica, id.NextSeq, id.Unrecorded
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("ledger spool: %w", err)
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, s.saveIdentity()
}

// load reads the batch files in sequence order; one that cannot be read is set aside
// (renamed *.corrupt) and counted.
func (s *spool) load() error {
	names, err := filepath.Glob(filepath.Join(s.dir, "batch-*.json"))
	if err != nil {
		return fmt.Errorf("ledger spool: %w", err)
	}
	sort.Strings(names) // the sequence is zero-padded
	for _, name := range names {
		raw, err := os.ReadFile(name)
		var b Batch
		if err == nil {
			err = json.Unmarshal(raw, &b)
		}
		if err != nil || b.Replica == "" {
			_ = os.Rename(name, name+".corrupt")
			s.corrupt++
			continue
		}
		if b.Replica == s.replica && b.Seq >= s.next {
			s.next = b.Seq + 1
		}
		s.pending = append(s.pending, spooled{b: &b, size: int64(len(raw))})
		s.bytes += int64(len(raw))
	}
	return nil
}

// assign gives b the replica and the next sequence, kept in the directory before the
// batch goes anywhere, so a restarted process never reuses one.
func (s *spool) assign(b *Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b.Replica, b.Seq = s.replica, s.next
	s.next++
	return s.saveIdentity()
}

func (s *spool) saveIdentity() error {
	if s.dir == "" {
		return nil
	}
	raw, _ := json.Marshal(identity{Replica: s.replica, NextSeq: s.next, Unrecorded: s.lost})
	return s.writeFile(identityFile, raw)
}

// lose adds d to what the replica could not record (expired: set aside unreplayed;
// else dropped) and keeps it with the identity.
func (s *spool) lose(d Dropped, expired bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &s.lost.Dropped
	if expired {
		t = &s.lost.Expired
	}
	t.add(&d)
	return s.saveIdentity()
}

// unrecorded is what the replica could not record, since its identity began.
func (s *spool) unrecorded() unrecorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// push keeps b unless the bound has no room for it; false when it did not.
func (s *spool) push(b *Batch) (bool, error) {
	raw, err := json.Marshal(b)
	if err != nil {
		return false, fmt.Errorf("ledger spool: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bytes+int64(len(raw)) > s.max {
		return false, nil
	}
	if s.dir != "" {
		if err := s.writeFile(batchFile(b.Seq, b.Replica), raw); err != nil {
			return false, err
		}
	}
	s.pending = append(s.pending, spooled{b: b, size: int64(len(raw))})
	s.bytes += int64(len(raw))
	return true, nil
}

// batchFile names a batch's file: the sequence first, zero-padded, so that names sort
// in order; the replica's hash apart, for batches an earlier identity left.
func batchFile(seq int64, replica string) string {
	var h uint32 = 2166136261
	for i := 0; i < len(replica); i++ {
		h = (h ^ uint32(replica[i])) * 16777619
	}
	return fmt.Sprintf("batch-%020d-%08x.json", seq, h)
}

// first is the oldest batch waiting, or nil.
func (s *spool) first() *Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return nil
	}
	return s.pending[0].b
}

// pop removes the oldest batch once the sink has it.
func (s *spool) pop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pending[0]
	s.pending = s.pending[1:]
	s.bytes -= p.size
	if s.dir == "" {
		return nil
	}
	if err := os.Remove(filepath.Join(s.dir, batchFile(p.b.Seq, p.b.Replica))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("ledger spool: %w", err)
	}
	return nil
}

// oldest is when the oldest batch waiting was made; zero with none (or one that
// does not say).
func (s *spool) oldest() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 || s.pending[0].b.Created == 0 {
		return time.Time{}
	}
	return time.Unix(s.pending[0].b.Created, 0)
}

// size is how many batches and bytes wait.
func (s *spool) size() (int, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending), s.bytes
}

// writeFile writes a file of the spool whole: a temporary file renamed into place.
func (s *spool) writeFile(name string, raw []byte) error {
	tmp := filepath.Join(s.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, raw, 0o640); err != nil {
		return fmt.Errorf("ledger spool: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, name)); err != nil {
		return fmt.Errorf("ledger spool: %w", err)
	}
	return nil
}
