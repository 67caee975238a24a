// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// statusOptions are the flags of `status`.
type statusOptions struct {
	*Options
	out *outputFlags
	all bool
}

func newStatusCommand(o *Options) *cobra.Command {
	s := &statusOptions{Options: o, out: newOutputFlags()}
	cmd := &cobra.Command{
		Use:   "status [FLEET]",
		Short: "What each fleet's replicas enforce, its upstreams' health, Redis's and the ledger's reach, and the conditions that need a hand",
		Long: `status reads each TokenProxy's status: the live replicas that enforce the current config, the
upstreams the replicas report unhealthy (circuit breaker open, credential cooling down after a 429), and
every condition that needs a hand, with what to do (LedgerSpooling True among them: settlements wait in
a replica's spool because the ledger database does not take them). Redis's and the ledger's reach are
read from the replicas' report Leases in the fleet's namespace, when the caller may list them: which
replicas read Redis, and what waits in each replica's spool and through when it is recorded.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return s.run(cmd.Context(), args)
		},
	}
	s.out.addFlags(cmd)
	cmd.Flags().BoolVarP(&s.all, "all-namespaces", "A", false, "Read the fleets of every namespace.")
	return cmd
}

// FleetStatus is one fleet as status prints it.
type FleetStatus struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Storage   string `json:"storage,omitempty"`
	// Replicas and ReadyReplicas are the Deployment's pods; LiveReplicas the replicas
	// that report themselves, EnforcedReplicas those of them that run ConfigGeneration.
	Replicas         int32  `json:"replicas"`
	ReadyReplicas    int32  `json:"readyReplicas"`
	LiveReplicas     int32  `json:"liveReplicas"`
	EnforcedReplicas int32  `json:"enforcedReplicas"`
	ConfigGeneration int64  `json:"configGeneration,omitempty"`
	Divisor          int64  `json:"divisor,omitempty"`
	Budgets          int32  `json:"budgets"`
	Keys             int32  `json:"keys"`
	Upstreams        string `json:"upstreams,omitempty"`
	// UnhealthyUpstreams are the upstreams a live replica reports unhealthy.
	UnhealthyUpstreams []twv1alpha1.UnhealthyUpstream `json:"unhealthyUpstreams,omitempty"`
	// Redis is what the replicas' reports say of Redis; absent under memory storage.
	Redis *RedisReach `json:"redis,omitempty"`
	// Ledger is what the replicas' reports say of the spend ledger; absent without one.
	Ledger *LedgerReach `json:"ledger,omitempty"`
	// Conditions are the fleet's conditions, each with what to do when it needs a hand.
	Conditions []Condition `json:"conditions,omitempty"`
}

// RedisReach is whether the live replicas could read Redis at their last usage scan
// (a replica that could not reports its own buckets).
type RedisReach struct {
	// Readable is false when the caller may not list the replicas' Leases; Note says so.
	Readable    bool     `json:"readable"`
	Reachable   []string `json:"reachable,omitempty"`
	Unreachable []string `json:"unreachable,omitempty"`
	Note        string   `json:"note,omitempty"`
}

// Condition is one condition of a fleet.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// NeedsYou is true for a condition that needs a hand: Accepted, Ready or Enforced
	// False, Degraded, DurableBudgetsFenced or LedgerSpooling True.
	NeedsYou bool `json:"needsYou,omitempty"`
	// WhatToDo is what docs/operator.md says to do for its reason.
	WhatToDo string `json:"whatToDo,omitempty"`
}

// whatToDo is what to do for each reason of a TokenProxy condition that needs a hand,
// in the words of the operator's conditions table.
var whatToDo = map[string]string{
	twv1alpha1.ReasonInvalidConfig:              "Fix the field the message names; the next reconcile renders and writes.",
	twv1alpha1.ReasonCredentialSecretNotFound:   "Create the Secret or the key, or fix the reference.",
	twv1alpha1.ReasonCredentialSecretKeyMissing: "Create the Secret or the key, or fix the reference.",
	twv1alpha1.ReasonNoReplicas:                 "Are the pods running, and can they write Leases (their logs say `Could not renew the replica's report Lease`)?",
	twv1alpha1.ReasonReplicasBehind:             "Its log says why (`Refused a config document`, with the field); `/admin/effective` on it shows the generation in force.",
	twv1alpha1.ReasonConfigChunkTaken:           "Delete or rename that ConfigMap; the next reconcile writes the chunk and clears the condition.",
	twv1alpha1.ReasonCounterStateLost: "Restore the balances or attest what Redis holds with `POST /admin/durable/attest` on one replica (docs/runbooks.md). " +
		"Never flush or restart Redis empty to clear it.",
	twv1alpha1.ReasonSpooling: "Make the ledger database reachable from the proxies (is it up, does the URL in its Secret still hold, " +
		"does a NetworkPolicy let them reach it?); a spooling replica's log says why (`Ledger flush failed`). " +
		"Each replica replays its spool once the database answers, and the condition clears by itself.",
	twv1alpha1.ReasonSpoolFull: "Make the ledger database reachable from the proxies first, as for Spooling: what no longer fits a spool is " +
		"not recorded (tokenwarden_ledger_unrecorded_requests_total), or, with whenSpoolFull: Refuse, the requests cost budgets govern are refused. " +
		"To hold a longer outage, raise spec.ledger.spoolSize.",
	"ReadFailed": "Restore the operator's ClusterRole (`config/rbac/role.yaml`, the chart's) or whatever refused it. It clears by itself on the next successful reconcile.",
}

// stepFailed is what to do when a step of the reconcile failed (<Step>Failed).
const stepFailed = "Read the message: remove or rename the object in the way, grant the permission, fix the webhook."

// needsYou reports whether a condition needs a hand.
func needsYou(c metav1.Condition) bool {
	switch c.Type {
	case twv1alpha1.ConditionDegraded, twv1alpha1.ConditionDurableBudgetsFenced, twv1alpha1.ConditionLedgerSpooling:
		return c.Status == metav1.ConditionTrue
	case twv1alpha1.ConditionAccepted, twv1alpha1.ConditionReady, twv1alpha1.ConditionEnforced:
		return c.Status == metav1.ConditionFalse
	}
	return false
}

// adviceFor is what to do for a condition that needs a hand; empty when the table
// says nothing for its reason.
func adviceFor(c metav1.Condition) string {
	if a, ok := whatToDo[c.Reason]; ok {
		return a
	}
	if c.Type == twv1alpha1.ConditionDegraded && strings.HasSuffix(c.Reason, "Failed") {
		return stepFailed
	}
	return ""
}

func (s *statusOptions) run(ctx context.Context, args []string) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	sc := scope{all: s.all}
	if !s.all || len(args) == 1 {
		if sc.namespace, err = s.namespace(); err != nil {
			return err
		}
		sc.all = false
	}
	var fleets []twv1alpha1.TokenProxy
	if len(args) == 1 {
		var tp twv1alpha1.TokenProxy
		if err := c.Get(ctx, types.NamespacedName{Namespace: sc.namespace, Name: args[0]}, &tp); err != nil {
			return readError(err, "get", "tokenproxies.tokenwarden.io "+strconv.Quote(args[0]), sc.where())
		}
		fleets = append(fleets, tp)
	} else {
		var list twv1alpha1.TokenProxyList
		if err := c.List(ctx, &list, sc.listOptions()...); err != nil {
			return readError(err, "list", "tokenproxies.tokenwarden.io", sc.where())
		}
		fleets = list.Items
	}
	out := make([]FleetStatus, 0, len(fleets))
	for i := range fleets {
		out = append(out, s.fleetStatus(ctx, c, &fleets[i]))
	}
	if !s.out.table() {
		return s.out.printRows(s.Streams.Out, out)
	}
	if len(out) == 0 {
		_, err := fmt.Fprintf(s.Streams.Out, "No TokenProxy %s.\n", sc.where())
		return err
	}
	return s.printTable(s.Streams.Out, out, sc)
}

// fleetStatus is a fleet's status, with Redis's reachability from its replicas' Leases.
func (s *statusOptions) fleetStatus(ctx context.Context, c client.Client, tp *twv1alpha1.TokenProxy) FleetStatus {
	st := &tp.Status
	f := FleetStatus{
		Namespace: tp.Namespace, Name: tp.Name, Storage: string(st.Storage),
		Replicas: st.Replicas, ReadyReplicas: st.ReadyReplicas, LiveReplicas: st.LiveReplicas, EnforcedReplicas: st.EnforcedReplicas,
		ConfigGeneration: st.ConfigGeneration, Divisor: st.Divisor, Budgets: st.Budgets, Keys: st.Keys,
		Upstreams: st.Upstreams, UnhealthyUpstreams: st.UnhealthyUpstreams,
	}
	if f.Storage == "" {
		f.Storage = string(tp.Spec.Storage.Type)
	}
	for _, cond := range st.Conditions {
		v := Condition{Type: cond.Type, Status: string(cond.Status), Reason: cond.Reason, Message: cond.Message, NeedsYou: needsYou(cond)}
		if v.NeedsYou {
			v.WhatToDo = adviceFor(cond)
		}
		f.Conditions = append(f.Conditions, v)
	}
	redis, ledger := f.Storage == string(twv1alpha1.StorageRedis), hasLedger(tp)
	if !redis && !ledger {
		return f
	}
	leases, err := s.replicaLeases(ctx, c, tp)
	if redis {
		f.Redis = redisReach(leases, err, s.Now())
	}
	if ledger {
		f.Ledger = ledgerReach(leases, err, s.Now())
	}
	return f
}

// replicaLeases lists the fleet's replicas' report Leases; the error says, in the
// caller's words, that they are not readable.
func (s *statusOptions) replicaLeases(ctx context.Context, c client.Client, tp *twv1alpha1.TokenProxy) ([]coordinationv1.Lease, error) {
	var leases coordinationv1.LeaseList
	err := c.List(ctx, &leases, client.InNamespace(tp.Namespace), client.MatchingLabels{twv1alpha1.ReplicaConfigMapLabel: tp.Name + "-proxy"})
	if err != nil {
		return nil, fmt.Errorf("the replicas' reports are not readable: %w",
			readError(err, "list", "leases.coordination.k8s.io", fmt.Sprintf("in namespace %q", tp.Namespace)))
	}
	return leases.Items, nil
}

// redisReach reads the fleet's live replicas' usage reports: a replica whose last scan
// could not read Redis reports its own buckets (its usage report's "s" is false).
func redisReach(leases []coordinationv1.Lease, err error, now time.Time) *RedisReach {
	if err != nil {
		return &RedisReach{Note: err.Error()}
	}
	r := &RedisReach{Readable: true}
	for i := range leases {
		le := &leases[i]
		if !liveLease(le, now) {
			continue
		}
		var u struct {
			Shared bool `json:"s"`
		}
		if err := json.Unmarshal([]byte(le.Annotations[twv1alpha1.ReplicaUsageAnnotation]), &u); err != nil {
			continue // no report yet
		}
		name := ""
		if le.Spec.HolderIdentity != nil {
			name = *le.Spec.HolderIdentity
		}
		if u.Shared {
			r.Reachable = append(r.Reachable, name)
		} else {
			r.Unreachable = append(r.Unreachable, name)
		}
	}
	slices.Sort(r.Reachable)
	slices.Sort(r.Unreachable)
	return r
}

// liveLease reports whether a replica's Lease is renewed: renewTime plus its duration
// is in the future, by the caller's clock.
func liveLease(le *coordinationv1.Lease, now time.Time) bool {
	if le.Spec.RenewTime == nil || le.Spec.LeaseDurationSeconds == nil {
		return false
	}
	return le.Spec.RenewTime.Add(time.Duration(*le.Spec.LeaseDurationSeconds) * time.Second).After(now)
}

// redisColumn is the REDIS column: the live replicas that read Redis, of those that report.
func redisColumn(f FleetStatus) string {
	switch r := f.Redis; {
	case r == nil:
		return "-"
	case !r.Readable:
		return "unknown"
	case len(r.Reachable)+len(r.Unreachable) == 0:
		return "no reports"
	default:
		return fmt.Sprintf("%d/%d", len(r.Reachable), len(r.Reachable)+len(r.Unreachable))
	}
}

// conditionStatus is a condition's status, empty when the fleet has none of that type.
func conditionStatus(f FleetStatus, typ string) string {
	for _, c := range f.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// printTable prints the fleets' table, then what needs a hand, fleet by fleet.
func (s *statusOptions) printTable(w io.Writer, fleets []FleetStatus, sc scope) error {
	header := []string{"NAME", "ENFORCED", "GENERATION", "UPSTREAMS", "REDIS", "LEDGER", "DEGRADED"}
	if s.out.wide() {
		header = append(header, "STORAGE", "REPLICAS", "READY", "DIVISOR", "BUDGETS", "KEYS", "RECORDED THROUGH")
	}
	if sc.all {
		header = append([]string{"NAMESPACE"}, header...)
	}
	var rows [][]string
	for _, f := range fleets {
		row := []string{f.Name, fmt.Sprintf("%d/%d", f.EnforcedReplicas, f.LiveReplicas), strconv.FormatInt(f.ConfigGeneration, 10),
			f.Upstreams, redisColumn(f), ledgerColumn(f), conditionStatus(f, twv1alpha1.ConditionDegraded)}
		if s.out.wide() {
			row = append(row, f.Storage, strconv.Itoa(int(f.Replicas)), strconv.Itoa(int(f.ReadyReplicas)),
				strconv.FormatInt(f.Divisor, 10), strconv.Itoa(int(f.Budgets)), strconv.Itoa(int(f.Keys)), lastFlush(f))
		}
		if sc.all {
			row = append([]string{f.Namespace}, row...)
		}
		rows = append(rows, row)
	}
	if err := printTable(w, header, rows); err != nil {
		return err
	}
	for _, f := range fleets {
		printNotes(w, f, sc.all)
	}
	return nil
}

// printNotes prints what needs a hand in a fleet: each condition, with what to do,
// the unhealthy upstreams, the replicas that could not read Redis and those whose
// settlements wait in their ledger spool.
func printNotes(w io.Writer, f FleetStatus, all bool) {
	name := f.Name
	if all {
		name = f.Namespace + "/" + f.Name
	}
	first := true
	note := func(format string, args ...any) {
		if first {
			fmt.Fprintf(w, "\n%s:\n", name)
			first = false
		}
		fmt.Fprintf(w, "  "+format+"\n", args...)
	}
	for _, c := range f.Conditions {
		if !c.NeedsYou {
			continue
		}
		note("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
		if c.WhatToDo != "" {
			note("  What to do: %s", c.WhatToDo)
		}
	}
	for _, u := range f.UnhealthyUpstreams {
		var parts []string
		if u.OpenReplicas > 0 {
			parts = append(parts, fmt.Sprintf("circuit breaker open on %s", replicas(u.OpenReplicas)))
		}
		if u.CoolingReplicas > 0 {
			parts = append(parts, fmt.Sprintf("credential cooling down after a 429 on %s", replicas(u.CoolingReplicas)))
		}
		if u.BillingReplicas > 0 {
			parts = append(parts, fmt.Sprintf("provider account out of credit (billing) on %s", replicas(u.BillingReplicas)))
		}
		note("Upstream %s unhealthy: %s.", u.Name, strings.Join(parts, ", "))
		if u.Reason == "Billing" {
			note("  The provider said: %q (cooling %d s, asked %d s); add credit or raise the spend limit, then probe it: POST /admin/upstreams/%s/probe.",
				u.Message, u.AppliedSeconds, u.RequestedSeconds, u.Name)
		}
	}
	if r := f.Redis; r != nil {
		switch {
		case !r.Readable:
			note("Redis: %s.", r.Note)
		case len(r.Unreachable) > 0:
			note("Redis: %s could not read it at the last usage scan (%s); such a replica admits on its own buckets at its share, "+
				"or answers 503 when spec.storage.redis.fallbackToMemory is false.", replicas(int32(len(r.Unreachable))), strings.Join(r.Unreachable, ", "))
		}
	}
	for _, n := range ledgerNotes(f.Ledger) {
		note("%s", n)
	}
}

// replicas is "1 replica" or "n replicas".
func replicas(n int32) string {
	if n == 1 {
		return "1 replica"
	}
	return fmt.Sprintf("%d replicas", n)
}
