// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// Store checks. At start and every CheckOptions.Interval the store checks the Redis
// it counts in, on every master: that it will not evict counters (maxmemory-policy
// noeviction), that the fleet's user cannot destroy them outside the scripts
// (FLUSHALL, FLUSHDB, RESTORE, DEBUG, DEL and UNLINK of a counter key, asked with ACL
// DRYRUN), that a cluster keeps serving its other slots when a master fails
// (cluster-require-full-coverage no), and whether keys were evicted since the last
// check (INFO stats evicted_keys rising). The checks run on the check credential's
// connection when one is configured, else on the fleet's own; a check the connection
// has no permission for is skipped, never failed.
//
// In enforce mode a failed check fences the durable rules (calendar windows and cost
// amounts) until a check passes again; in report mode it is only reported. Keys
// evicted fence the durable rules in both modes, until the balances are attested: an
// eviction is lost state, as a lost epoch is.

// Check modes (rate_limiting.redis.checks.mode).
const (
	// CheckReport reports the checks (metric, log, /admin/durable) and fences only on
	// evictions.
	CheckReport = "report"
	// CheckEnforce also fences the durable rules while a check fails.
	CheckEnforce = "enforce"
)

// The checks, as the metric and the reports name them.
const (
	CheckMaxmemoryPolicy     = "maxmemory_policy"
	CheckDestructiveCommands = "destructive_commands"
	CheckClusterFullCoverage = "cluster_full_coverage"
	CheckEvictions           = "evictions"
)

// Check results.
const (
	CheckPass    = "pass"
	CheckFail    = "fail"
	CheckSkipped = "skipped"
)

// CheckOptions configure the store checks.
type CheckOptions struct {
	// Mode is CheckReport or CheckEnforce; empty runs no checks.
	Mode string
	// Interval is how often the checks run after the first, at start; 0 is a minute.
	// Below 0 they run only when CheckStore is called (tests).
	Interval time.Duration
	// Username and Password are the check credential: a Redis user that may run
	// CONFIG GET, ACL DRYRUN and INFO (and on a cluster CLUSTER SLOTS). Both empty:
	// the fleet's own connection, which skips what its user may not run.
	Username, Password string
}

// CheckRecorder records each check's result (metrics.Metrics implements it).
type CheckRecorder interface {
	StoreCheck(check, result string)
}

// checker is the store's checking state.
type checker struct {
	// set are the settings in force; a reload replaces them (SetChecks).
	set atomic.Pointer[checkSettings]
	// base are the store's options, for a check credential's connection.
	base *Options
	// user is the fleet's Redis user, whose permissions ACL DRYRUN asks about.
	user string
	// primary is the Sentinel master's name, "" for one server or a cluster.
	primary string
	rec     CheckRecorder
	// setMu serialises SetChecks and starting or stopping the checking goroutine;
	// running is true while it runs, and kick tells it the settings changed.
	setMu   sync.Mutex
	running bool
	kick    chan struct{}
	// mu serialises the checks; retired are check connections replaced by a reload,
	// closed by the next check round (guarded by mu).
	mu      sync.Mutex
	retired []redis.UniversalClient
	// evMu guards evicted, each server's evicted_keys when last seen, by its run id (a
	// restart or a failover starts from the new server's count): the masters of a
	// cluster are checked at once.
	evMu    sync.Mutex
	evicted map[string]int64
	results atomic.Pointer[[]budget.CheckResult]
	// failing fences the durable rules while a check fails in enforce mode; evicted
	// until the balances are attested. Each holds the reason, nil when clear.
	failing, evictedFence atomic.Pointer[string]
}

// checkSettings are the checks' settings in force.
type checkSettings struct {
	// opts are the options as given, to tell a change.
	opts     CheckOptions
	mode     string
	interval time.Duration
	// c is the connection the checks run on: the check credential's, or the store's.
	c redis.UniversalClient
	// own is true when c is the check credential's (closed with the store).
	own bool
}

// destructive are the commands the fleet's user must not run, each as ACL DRYRUN asks
// about it; key is a counter key of the fleet's.
func destructive(key string) [][]any {
	return [][]any{
		{"FLUSHALL"}, {"FLUSHDB"}, {"RESTORE", key, "0", "x"}, {"DEBUG", "SLEEP", "0"},
		{"DEL", key}, {"UNLINK", key},
	}
}

// newChecker builds the checks of store s, in force from the start.
func newChecker(s *Store, o *Options) (*checker, error) {
	ck := &checker{base: o, evicted: map[string]int64{}, kick: make(chan struct{}, 1)}
	if t, err := config.ParseRedisURL(o.URL); err == nil {
		ck.user, ck.primary = t.Username, t.MasterName
	}
	if ck.user == "" {
		ck.user = "default"
	}
	if r, ok := o.Recorder.(CheckRecorder); ok {
		ck.rec = r
	}
	set, err := ck.settings(s, o.Checks)
	if err != nil {
		return nil, err
	}
	ck.set.Store(set)
	return ck, nil
}

// settings builds the settings co configures, with the check credential's connection.
func (ck *checker) settings(s *Store, co CheckOptions) (*checkSettings, error) {
	if co.Mode != "" && co.Mode != CheckReport && co.Mode != CheckEnforce {
		return nil, fmt.Errorf("rate_limiting.redis.checks.mode: want %q or %q, got %q", CheckReport, CheckEnforce, co.Mode)
	}
	set := &checkSettings{opts: co, mode: co.Mode, interval: co.Interval, c: s.c}
	if set.interval == 0 {
		set.interval = time.Minute
	}
	if co.Mode != "" && (co.Username != "" || co.Password != "") {
		user := co.Username
		if user == "" {
			user = "default"
		}
		c, _, err := newClientAs(ck.base, user, co.Password)
		if err != nil {
			return nil, err
		}
		set.c, set.own = c, true
	}
	return set, nil
}

// periodic tells whether settings run on their own, every interval.
func (set *checkSettings) periodic() bool { return set.mode != "" && set.interval > 0 }

// SetChecks puts o in force in place of the checks' settings, as a reload does: a
// changed mode, interval or check credential applies at once, with a round of
// checks run now when they run periodically. The same settings change nothing. An
// empty mode stops the checks and lifts what a failed check fenced; an eviction's
// fence stays until the balances are attested.
func (s *Store) SetChecks(o CheckOptions) error {
	ck := s.checks
	ck.setMu.Lock()
	defer ck.setMu.Unlock()
	old := ck.set.Load()
	if old.opts == o {
		return nil
	}
	set, err := ck.settings(s, o)
	if err != nil {
		return err
	}
	ck.set.Store(set)
	if old.own {
		ck.mu.Lock()
		ck.retired = append(ck.retired, old.c)
		ck.mu.Unlock()
	}
	if set.mode == "" {
		ck.results.Store(nil)
		if ck.failing.Swap(nil) != nil {
			s.epochChanged()
		}
	}
	s.log.Info("Redis store checks reconfigured", "mode", set.mode, "interval", set.interval, "check_user", o.Username)
	select {
	case <-s.done:
		return nil
	default:
	}
	switch {
	case set.periodic() && !ck.running:
		ck.running = true
		s.workers.Add(1)
		go s.runChecks()
	case ck.running:
		select {
		case ck.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// startChecks starts the checking goroutine when the settings run periodically.
func (s *Store) startChecks() {
	ck := s.checks
	ck.setMu.Lock()
	defer ck.setMu.Unlock()
	if ck.set.Load().periodic() {
		ck.running = true
		s.workers.Add(1)
		go s.runChecks()
	}
}

// runChecks runs the checks now and then every interval until the store closes or
// the settings no longer run periodically; a change of settings runs them at once.
func (s *Store) runChecks() {
	defer s.workers.Done()
	ck := s.checks
	for {
		if !s.stillPeriodic() {
			return
		}
		s.CheckStore(context.Background())
		t := time.NewTimer(ck.set.Load().interval)
		select {
		case <-s.done:
			t.Stop()
			return
		case <-ck.kick:
		case <-t.C:
		}
		t.Stop()
	}
}

// stillPeriodic tells whether the checking goroutine goes on; when not, it is no
// longer running.
func (s *Store) stillPeriodic() bool {
	ck := s.checks
	ck.setMu.Lock()
	defer ck.setMu.Unlock()
	if ck.set.Load().periodic() {
		return true
	}
	ck.running = false
	return false
}

// closeChecks closes the check connections the store opened.
func (ck *checker) closeChecks() {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	for _, c := range ck.retired {
		_ = c.Close()
	}
	ck.retired = nil
	if set := ck.set.Load(); set.own {
		_ = set.c.Close()
	}
}

// CheckStore runs every check once, on every master, with the settings in force,
// records the results and fences or lifts the durable rules as they say; nil when the
// store runs no checks.
func (s *Store) CheckStore(ctx context.Context) []budget.CheckResult {
	ck := s.checks
	ck.mu.Lock()
	defer ck.mu.Unlock()
	for _, c := range ck.retired {
		_ = c.Close()
	}
	ck.retired = nil
	set := ck.set.Load()
	if set.mode == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	names := []string{CheckMaxmemoryPolicy, CheckDestructiveCommands}
	if s.sharded {
		names = append(names, CheckClusterFullCoverage)
	}
	names = append(names, CheckEvictions)
	per := make([][]budget.CheckResult, len(names))
	var mu sync.Mutex
	err := eachMaster(ctx, set.c, func(ctx context.Context, c *redis.Client) error {
		addr := c.Options().Addr
		if ck.primary != "" {
			addr = "the primary of " + ck.primary // a Sentinel client has no one address
		}
		for i, name := range names {
			r := s.checkOne(ctx, c, name)
			if r.Detail != "" {
				r.Detail = addr + ": " + r.Detail
			}
			mu.Lock()
			per[i] = append(per[i], r)
			mu.Unlock()
		}
		return nil
	})
	results := make([]budget.CheckResult, len(names))
	for i, name := range names {
		results[i] = worst(name, per[i])
		if err != nil && len(per[i]) == 0 {
			results[i] = budget.CheckResult{Check: name, Result: CheckSkipped, Detail: "the masters could not be listed: " + err.Error()}
		}
	}
	s.recordChecks(set, results)
	return results
}

// eachMaster runs f on every master of uc: each of a cluster's, or the one server.
func eachMaster(ctx context.Context, uc redis.UniversalClient, f func(context.Context, *redis.Client) error) error {
	switch c := uc.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, f)
	case *redis.Client:
		return f(ctx, c)
	}
	return fmt.Errorf("a %T cannot be checked", uc)
}

// worst combines one check's results over the masters: a failure wins, then a skip.
func worst(name string, rs []budget.CheckResult) budget.CheckResult {
	out := budget.CheckResult{Check: name, Result: CheckPass}
	rank := map[string]int{CheckPass: 0, CheckSkipped: 1, CheckFail: 2}
	var details []string
	for _, r := range rs {
		if rank[r.Result] > rank[out.Result] {
			out.Result, details = r.Result, nil
		}
		if r.Result == out.Result && r.Detail != "" {
			details = append(details, r.Detail)
		}
	}
	slices.Sort(details)
	out.Detail = strings.Join(details, "; ")
	return out
}

// checkOne runs one check on one master.
func (s *Store) checkOne(ctx context.Context, c *redis.Client, name string) budget.CheckResult {
	r := budget.CheckResult{Check: name, Result: CheckPass}
	var err error
	switch name {
	case CheckMaxmemoryPolicy:
		err = configIs(ctx, c, "maxmemory-policy", "noeviction", &r)
	case CheckClusterFullCoverage:
		err = configIs(ctx, c, "cluster-require-full-coverage", "no", &r)
	case CheckDestructiveCommands:
		err = s.checks.denied(ctx, c, s.groups[0].prefix+"rule:storecheck", &r)
	case CheckEvictions:
		err = s.checks.evictions(ctx, c, &r)
	}
	if err != nil {
		r.Result, r.Detail = CheckSkipped, skipReason(err)
	}
	return r
}

// skipReason says why a check could not run.
func skipReason(err error) string {
	if redis.HasErrorPrefix(err, "NOPERM") {
		return "no permission to check (configure rate_limiting.redis.checks.username): " + err.Error()
	}
	return err.Error()
}

// configIs checks that a config parameter has the value want.
func configIs(ctx context.Context, c *redis.Client, param, want string, r *budget.CheckResult) error {
	got, err := c.ConfigGet(ctx, param).Result()
	if err != nil {
		return err
	}
	v, ok := got[param]
	if !ok {
		return fmt.Errorf("CONFIG GET %s: no such parameter", param)
	}
	if v != want {
		r.Result, r.Detail = CheckFail, fmt.Sprintf("%s is %s, want %s", param, v, want)
	}
	return nil
}

// denied checks with ACL DRYRUN that the fleet's user may run none of the destructive
// commands.
func (ck *checker) denied(ctx context.Context, c *redis.Client, key string, r *budget.CheckResult) error {
	var allowed []string
	for _, cmd := range destructive(key) {
		args := append([]any{"ACL", "DRYRUN", ck.user}, cmd...)
		reply, err := c.Do(ctx, args...).Text()
		if err != nil {
			return err
		}
		if reply == "OK" {
			allowed = append(allowed, cmd[0].(string))
		}
	}
	if len(allowed) > 0 {
		r.Result, r.Detail = CheckFail, fmt.Sprintf("user %s may run %s", ck.user, strings.Join(allowed, ", "))
	}
	return nil
}

// evictions checks that the server's evicted_keys did not rise since it was last seen.
// A server seen first (at start, after a restart or a failover: a new run id) starts
// from its count.
func (ck *checker) evictions(ctx context.Context, c *redis.Client, r *budget.CheckResult) error {
	info, err := c.Info(ctx, "server", "stats").Result()
	if err != nil {
		return err
	}
	run := infoField(info, "run_id")
	n, err := strconv.ParseInt(infoField(info, "evicted_keys"), 10, 64)
	if err != nil || run == "" {
		return errors.New("INFO has no run_id or evicted_keys")
	}
	ck.evMu.Lock()
	defer ck.evMu.Unlock()
	if prev, seen := ck.evicted[run]; seen && n > prev {
		r.Result, r.Detail = CheckFail, fmt.Sprintf("%d keys evicted since the last check", n-prev)
	}
	ck.evicted[run] = n
	return nil
}

// infoField reads a field of an INFO reply; "" when it has none.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// recordChecks stores the results, records them, logs each change and sets or lifts
// the fences.
func (s *Store) recordChecks(set *checkSettings, results []budget.CheckResult) {
	ck := s.checks
	prev := map[string]budget.CheckResult{}
	if p := ck.results.Load(); p != nil {
		for _, r := range *p {
			prev[r.Check] = r
		}
	}
	ck.results.Store(&results)
	changed := false
	var failing []string
	for _, r := range results {
		if ck.rec != nil {
			ck.rec.StoreCheck(r.Check, r.Result)
		}
		if p, ok := prev[r.Check]; !ok || p.Result != r.Result {
			changed = true
			s.logCheck(set.mode, r)
		}
		switch {
		case r.Result != CheckFail:
		case r.Check == CheckEvictions:
			reason := "evictions: " + r.Detail
			if ck.evictedFence.Swap(&reason) == nil {
				s.log.Error("Durable counters fenced: Redis evicted keys, so counters of calendar and cost rules may be lost; "+
					"they answer 503 until the balances are restored or attested", "group", s.name, "detail", r.Detail)
			}
			changed = true
		case set.mode == CheckEnforce:
			failing = append(failing, r.Check+": "+r.Detail)
		}
	}
	if len(failing) > 0 {
		reason := strings.Join(failing, "; ")
		if old := ck.failing.Swap(&reason); old == nil {
			s.log.Error("Durable counters fenced: a store check failed (rate_limiting.redis.checks.mode enforce); "+
				"calendar and cost rules answer 503 until it passes", "group", s.name, "failed", reason)
			changed = true
		}
	} else if ck.failing.Swap(nil) != nil {
		s.log.Info("Durable counters no longer fenced: the store checks pass", "group", s.name)
		changed = true
	}
	if changed {
		s.epochChanged()
	}
}

// logCheck logs a check's new result.
func (s *Store) logCheck(mode string, r budget.CheckResult) {
	switch r.Result {
	case CheckPass:
		s.log.Info("Redis store check passes", "check", r.Check, "mode", mode)
	case CheckSkipped:
		s.log.Warn("Redis store check skipped", "check", r.Check, "reason", r.Detail)
	default:
		s.log.Warn("Redis store check fails", "check", r.Check, "mode", mode, "detail", r.Detail)
	}
}

// checkFence is the refusal of a durable reservation while a store check fences the
// durable rules; nil when none does.
func (s *Store) checkFence() error {
	ck := s.checks
	var reasons []string
	for _, f := range []*string{ck.evictedFence.Load(), ck.failing.Load()} {
		if f != nil {
			reasons = append(reasons, *f)
		}
	}
	if len(reasons) == 0 {
		return nil
	}
	return &budget.RecoveringError{Group: s.name, Expected: s.want(), StoreCheck: strings.Join(reasons, "; ")}
}

// storeFence is what the store checks fence the durable rules for, "" when nothing.
func (s *Store) storeFence() string {
	var e *budget.RecoveringError
	if errors.As(s.checkFence(), &e) {
		return e.StoreCheck
	}
	return ""
}

// checkResults are the checks' last results; nil before the first.
func (s *Store) checkResults() []budget.CheckResult {
	if p := s.checks.results.Load(); p != nil {
		return *p
	}
	return nil
}

// attested lifts the eviction fence: the balances were restored or attested.
func (ck *checker) attested() { ck.evictedFence.Store(nil) }
