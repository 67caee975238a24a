// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/tokenwarden/tokenwarden/test/testproc"
)

// manager is the operator's manager binary run as a process of its own, as a pod runs
// it: given its memory limit in MEMORY_LIMIT_BYTES, from which it sets its Go memory
// limit (90%) as under the chart's Deployment, and held to that limit by a memory
// cgroup of its own, whose kernel kills it past the limit as a container's would.
type manager struct {
	cmd *exec.Cmd
	// cg is the manager's memory cgroup; nil when it runs without a limit.
	cg *memcg
	// limit is its memory limit in bytes, 0 for none.
	limit int64
	// metrics and pprof are the base URLs of its metrics and profiles.
	metrics, pprof string
	logPath        string
	log            *os.File
	exited         chan struct{}
	// state is how it exited, once exited is closed.
	state *os.ProcessState
}

// startManager runs binary against the API server of kubeconfig, under limit bytes
// of memory (0: none), with the extra flags (BENCH_MANAGER_FLAGS: --zap-log-level=1
// logs each status write to settle again), and waits until its metrics are served.
func startManager(ctx context.Context, binary, kubeconfig, dir string, limit int64, flags []string) (m *manager, err error) {
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = testproc.FreePort(); err != nil {
			return nil, err
		}
	}
	m = &manager{limit: limit, exited: make(chan struct{}), logPath: filepath.Join(dir, "manager.log"),
		metrics: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), pprof: fmt.Sprintf("http://127.0.0.1:%d", ports[2])}
	if m.log, err = os.Create(m.logPath); err != nil {
		return nil, err
	}
	args := []string{binary, "--leader-elect=false", "--metrics-secure=false",
		"--metrics-bind-address=" + strings.TrimPrefix(m.metrics, "http://"),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[1]),
		"--pprof-bind-address=" + strings.TrimPrefix(m.pprof, "http://")}
	args = append(args, flags...)
	env := append(os.Environ(), "KUBECONFIG="+kubeconfig)
	if limit > 0 {
		if m.cg, err = newMemcg(limit); err != nil {
			_ = m.log.Close()
			return nil, err
		}
		// The manager joins its cgroup before it allocates anything: the shell moves
		// itself, then becomes the manager.
		args = append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, m.cg.procs()}, args...)
		env = append(env, fmt.Sprintf("MEMORY_LIMIT_BYTES=%d", limit))
	}
	m.cmd = exec.Command(args[0], args[1:]...)
	m.cmd.Env = env
	// Through a pipe: the log's page cache is not charged to the manager's cgroup.
	m.cmd.Stdout, m.cmd.Stderr = struct{ io.Writer }{m.log}, struct{ io.Writer }{m.log}
	if err := m.cmd.Start(); err != nil {
		m.cleanup()
		return nil, err
	}
	go func() {
		_ = m.cmd.Wait()
		m.state = m.cmd.ProcessState
		close(m.exited)
	}()
	defer func() {
		if err != nil {
			m.stop()
		}
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		if err := m.alive(); err != nil {
			return nil, err
		}
		if _, err := m.get(ctx, m.metrics+"/metrics"); err == nil {
			return m, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the manager serves no metrics after a minute:\n%s", m.tail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// alive is nil while the manager runs; once it exited (killed past its memory limit,
// or failed), an error saying how, with its cgroup's kills and its log's end.
func (m *manager) alive() error {
	select {
	case <-m.exited:
	default:
		return nil
	}
	kills := ""
	if m.cg != nil {
		kills = fmt.Sprintf("; its cgroup's OOM kills: %d", m.cg.oomKills())
	}
	return fmt.Errorf("the manager exited (%v)%s: a pod would be restarted\n%s", m.state, kills, m.tail())
}

// tail is the end of the manager's log.
func (m *manager) tail() string {
	data, _ := os.ReadFile(m.logPath)
	return string(data[max(0, len(data)-4096):])
}

// stop ends the manager and removes its cgroup.
func (m *manager) stop() {
	if m.cmd.Process != nil {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(10 * time.Second):
			_ = m.cmd.Process.Kill()
			<-m.exited
		}
	}
	m.cleanup()
}

func (m *manager) cleanup() {
	_ = m.log.Close()
	if m.cg != nil {
		m.cg.remove()
	}
}

// get reads a URL of the manager.
func (m *manager) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, err
}

// heapAfterGC is the manager's live heap: its HeapAlloc right after a collection,
// which the text heap profile runs first.
func (m *manager) heapAfterGC(ctx context.Context) (uint64, error) {
	body, err := m.get(ctx, m.pprof+"/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(body)) {
		if rest, ok := strings.CutPrefix(line, "# HeapAlloc = "); ok {
			return strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
		}
	}
	return 0, errors.New("no HeapAlloc in the manager's heap profile")
}

// heapProfile writes the manager's heap profile (after a collection) to path.
func (m *manager) heapProfile(ctx context.Context, path string) error {
	body, err := m.get(ctx, m.pprof+"/debug/pprof/heap?gc=1")
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o600)
}

// status is a field of the manager's /proc status, in bytes (VmHWM: its peak
// resident memory; VmRSS: its resident memory now).
func (m *manager) status(field string) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// cpu is the user and system CPU time the manager has used.
func (m *manager) cpu() time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields 14 and 15 (utime, stime, in clock ticks of 1/100 s) follow the command
	// name, which is in parentheses.
	_, rest, _ := strings.Cut(string(data), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// describe is the manager's memory: under a limit, its cgroup's peak charge (what
// the limit counts) and OOM kills; and its peak resident memory, which also counts
// the binary's pages shared with the page cache, charged to the cgroup that read
// them first, so it may exceed the limit without a kill.
func (m *manager) describe() string {
	hwm := mib(float64(m.status("VmHWM")))
	if m.cg == nil {
		return "peak resident memory " + hwm + ", with no memory limit"
	}
	return fmt.Sprintf("its cgroup's peak charge %s under a limit of %s (page cache included; OOM kills: %d); peak resident memory %s (shared pages of the binary included)",
		mib(float64(m.cg.peak())), mib(float64(m.limit)), m.cg.oomKills(), hwm)
}

// memcg is a memory cgroup of its own, under this process's: cgroup v1's memory
// controller, or v2's.
type memcg struct {
	dir string
	v2  bool
	// mu serializes the reads of its files.
	mu sync.Mutex
}

// newMemcg makes a memory cgroup limited to limit bytes, a child of this process's
// own (which needs write access to it: root, on most machines).
func newMemcg(limit int64) (*memcg, error) {
	parent, v2, err := ownMemoryCgroup()
	if err != nil {
		return nil, err
	}
	c := &memcg{dir: filepath.Join(parent, fmt.Sprintf("tokenwarden-scale-%d", os.Getpid())), v2: v2}
	if err := os.Mkdir(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("a memory cgroup for the manager: %w", err)
	}
	file := "memory.limit_in_bytes"
	if v2 {
		file = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(c.dir, file), []byte(strconv.FormatInt(limit, 10)), 0o600); err != nil {
		c.remove()
		return nil, fmt.Errorf("the manager's memory limit: %w", err)
	}
	return c, nil
}

// procs is the file a process writes its pid to, to join the cgroup.
func (c *memcg) procs() string { return filepath.Join(c.dir, "cgroup.procs") }

// peak is the cgroup's highest memory charge.
func (c *memcg) peak() uint64 {
	file := "memory.max_usage_in_bytes"
	if c.v2 {
		file = "memory.peak"
	}
	data, _ := os.ReadFile(filepath.Join(c.dir, file))
	n, _ := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	return n
}

// oomKills is how many of the cgroup's processes the kernel killed for memory.
func (c *memcg) oomKills() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	file := "memory.oom_control"
	if c.v2 {
		file = "memory.events"
	}
	data, _ := os.ReadFile(filepath.Join(c.dir, file))
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(rest))
			return n
		}
	}
	return 0
}

// remove deletes the cgroup, once its processes are gone.
func (c *memcg) remove() {
	for range 50 {
		if err := os.Remove(c.dir); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ownMemoryCgroup is the directory of this process's memory cgroup, and whether it is
// cgroup v2's; v1's memory controller wins where both are mounted.
func ownMemoryCgroup() (string, bool, error) {
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false, err
	}
	var v1, v2, v1Root, v2Root string
	for line := range strings.Lines(string(mounts)) {
		// ID parent major:minor root mountpoint options... - fstype source superoptions
		pre, post, ok := strings.Cut(line, " - ")
		f, p := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(p) < 3 {
			continue
		}
		switch {
		case p[0] == "cgroup" && v1 == "" && hasOption(p[2], "memory"):
			v1, v1Root = f[4], f[3]
		case p[0] == "cgroup2" && v2 == "":
			if ctl, err := os.ReadFile(filepath.Join(f[4], "cgroup.controllers")); err == nil && hasField(string(ctl), "memory") {
				v2, v2Root = f[4], f[3]
			}
		}
	}
	sc := bufio.NewScanner(strings.NewReader(string(own)))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case v1 != "" && hasOption(parts[1], "memory"):
			return filepath.Join(v1, strings.TrimPrefix(parts[2], v1Root)), false, nil
		case v1 == "" && v2 != "" && parts[0] == "0":
			return filepath.Join(v2, strings.TrimPrefix(parts[2], v2Root)), true, nil
		}
	}
	return "", false, errors.New("no memory cgroup controller is mounted")
}

func hasOption(list, o string) bool {
	for v := range strings.SplitSeq(list, ",") {
		if v == o {
			return true
		}
	}
	return false
}

func hasField(list, o string) bool {
	for _, v := range strings.Fields(list) {
		if v == o {
			return true
		}
	}
	return false
}

// chartMemoryLimit is the operator's default memory limit in the chart's values.
func chartMemoryLimit(root string) (int64, error) {
	data, err := os.ReadFile(filepath.Join(root, "charts", "tokenwarden", "values.yaml"))
	if err != nil {
		return 0, err
	}
	var values struct {
		Resources struct {
			Limits struct {
				Memory string `json:"memory"`
			} `json:"limits"`
		} `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		return 0, fmt.Errorf("the chart's values: %w", err)
	}
	q, err := resource.ParseQuantity(values.Resources.Limits.Memory)
	if err != nil {
		return 0, fmt.Errorf("the chart's resources.limits.memory %q: %w", values.Resources.Limits.Memory, err)
	}
	return q.Value(), nil
}
