// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tokenwarden/tokenwarden/proxy/budget"
	"github.com/tokenwarden/tokenwarden/proxy/explain"
)

// explainOptions are the flags of `explain`.
type explainOptions struct {
	*Options
	out      *outputFlags
	replicas replicaFlags
	model    string
	route    string
	// upstream and attrs are the request's serving upstream and its attribute
	// headers, by query parameter.
	upstream string
	attrs    [len(attrFlags)]string
}

// attrFlags are the flags of the request's client-supplied attributes, each with its
// query parameter.
var attrFlags = [...]struct{ flag, param, usage string }{
	{"session", "session", "The request's session (its x-tokenwarden-session-id header); without it, a request that sends none."},
	{"agent", "agent", "The request's agent (x-tokenwarden-agent-id)."},
	{"task", "task", "The request's task (x-tokenwarden-task-id)."},
	{"run", "run", "The request's run (x-tokenwarden-run-id)."},
	{"request-fingerprint", "request_fingerprint", "The hash of the request as forwarded (hex), as the response cache keys it."},
}

func newExplainCommand(o *Options) *cobra.Command {
	x := &explainOptions{Options: o, out: newOutputFlags()}
	cmd := &cobra.Command{
		Use:   "explain KEY [--model M] [--route R] [--upstream U] [--session S] [--agent A] [--task T] [--run R]",
		Short: "Every budget and rule that applies to a key, in the order they are reserved",
		Long: `explain asks each replica of the fleet (GET /admin/explain on its admin port) which budgets and
rules apply to the key's requests for the model on the route, as the proxy's own resolver reserves
them: request counts first, then every other amount, dimension by dimension. It shows what replaces
what (a key's own override of per_api_key, a rule that names the key, its user or its team in place of
the rule for every other subject), the fleet's total and one replica's share of each (what each
replica enforces in memory mode), how much of each is used now, and which is tightest.

For each budget that selects on or counts by a request attribute (session, agent, task, run,
request fingerprint, provider, endpoint, environment, ...) it shows the request's value of each and
the counter it lands in: the flags name the request's attributes, and an attribute not named is one
the request does not send. A client-supplied value beyond its key's max_attribute_values distinct
values this window lands in the overflow subject, and explain says so. A rule whose appliesWhen the
request does not match is named with the value that keeps it out.

For an InFlight budget it shows the requests in flight now in the counter the request would take a
slot of, of its limit: the fleet's under Redis storage; under memory storage each replica's own (it
holds the limit alone, not divided), the busiest replica's with each one's beside it.

Under memory storage each replica holds its own buckets: USED is the most used replica's, and -o wide
shows each replica's. Under Redis storage every replica reads the same buckets.

It reaches the replicas as why does (port-forward with your credentials, or --admin-addr). A caller who
reads only some tenants (get tokenbudgets in their namespaces) is told only of their keys, and of the
platform's budgets without their use unless it may read the fleet's namespace.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return x.run(cmd.Context(), args[0])
		},
	}
	x.out.addFlags(cmd)
	x.replicas.addFlags(cmd)
	cmd.Flags().StringVar(&x.model, "model", "", "The model the requests ask for (the body's \"model\"); without it, budgets of a model do not apply.")
	cmd.Flags().StringVar(&x.route, "route", explain.DefaultRoute, "The request path; a path that is not a charged route draws only on request counts.")
	cmd.Flags().StringVar(&x.upstream, "upstream", "", "The upstream that serves the request (its provider); without it, the one the model's request goes to first.")
	for i, f := range attrFlags {
		cmd.Flags().StringVar(&x.attrs[i], f.flag, "", f.usage)
	}
	return cmd
}

// Explained is what explain prints: one replica's answer, with the use of each budget
// on every replica that answered.
type Explained struct {
	explain.Answer
	// Replicas are the replicas that answered, in order; Used holds, per budget, each
	// one's used percent (memory storage: each replica's own buckets).
	Replicas []string     `json:"replicas"`
	Used     [][]*float64 `json:"used_by_replica,omitempty"`
	// InFlight holds, per budget, each replica's requests in flight in an in-flight
	// window counted by each replica (nil for others).
	InFlight [][]*int64 `json:"in_flight_by_replica,omitempty"`
	// Generations are the replicas' config generations when they differ.
	Generations []int64 `json:"generations,omitempty"`
}

func (x *explainOptions) run(ctx context.Context, key string) error {
	ns, err := x.namespace()
	if err != nil {
		return err
	}
	a, err := x.connect(ctx, &x.replicas, ns)
	if err != nil {
		return err
	}
	defer a.Close()
	var out *Explained
	var failed []error
	q := url.Values{"api_key": {key}, "route": {x.route}}
	if x.model != "" {
		q.Set("model", x.model)
	}
	if x.upstream != "" {
		q.Set("upstream", x.upstream)
	}
	for i, f := range attrFlags {
		if x.attrs[i] != "" {
			q.Set(f.param, x.attrs[i])
		}
	}
	for _, r := range a.replica {
		var ans explain.Answer
		if err := a.get(ctx, r, "/admin/explain", q, &ans); err != nil {
			if refusedErr(err) {
				return err
			}
			failed = append(failed, err)
			continue
		}
		out = merge(out, r.name, ans)
	}
	if out == nil {
		return failed[0]
	}
	for _, err := range failed {
		fmt.Fprintf(x.Streams.ErrOut, "warning: %v\n", err)
	}
	out.busiest()
	out.tightest()
	if !x.out.table() {
		return x.out.printRows(x.Streams.Out, []*Explained{out})
	}
	return x.printTable(x.Streams.Out, out)
}

// merge adds one replica's answer: the first is the one printed, the others add their
// use of each budget (the same budgets, when they run the same generation).
func merge(e *Explained, name string, a explain.Answer) *Explained {
	if e == nil {
		e = &Explained{Answer: a}
	} else if a.Generation != e.Generation || len(a.Budgets) != len(e.Budgets) {
		if len(e.Generations) == 0 {
			e.Generations = []int64{e.Generation}
		}
		e.Generations = append(e.Generations, a.Generation)
		return e
	}
	e.Replicas = append(e.Replicas, name)
	for i := range a.Budgets {
		if len(e.Used) <= i {
			e.Used, e.InFlight = append(e.Used, nil), append(e.InFlight, nil)
		}
		e.Used[i] = append(e.Used[i], a.Budgets[i].UsedPercent)
		e.InFlight[i] = append(e.InFlight[i], a.Budgets[i].InFlight)
	}
	return e
}

// busiest makes each in-flight window counted by each replica show the busiest
// replica's count: each holds the limit on its own, and the busiest refuses first.
// InFlight keeps only the in-flight windows' counts.
func (e *Explained) busiest() {
	some := false
	for i := range e.InFlight {
		if slices.ContainsFunc(e.InFlight[i], func(n *int64) bool { return n != nil }) {
			some = true
		} else {
			e.InFlight[i] = nil
		}
	}
	if !some {
		e.InFlight = nil
	}
	for i := range e.Budgets {
		b := &e.Budgets[i]
		if b.InFlightOf != "replica" || i >= len(e.InFlight) {
			continue
		}
		for _, n := range e.InFlight[i] {
			if n != nil && (b.InFlight == nil || *n > *b.InFlight) {
				v := *n
				b.InFlight = &v
			}
		}
	}
}

// tightest makes each budget's UsedPercent the most used replica's, and Tightest the
// enforcing budget used most: under memory storage each replica's own buckets decide,
// and the most used one refuses first.
func (e *Explained) tightest() {
	if e.Levels != "memory" || len(e.Replicas) < 2 {
		return
	}
	most := 0.0
	e.Tightest = 0
	for i := range e.Budgets {
		b := &e.Budgets[i]
		for _, u := range e.Used[i] {
			if u != nil && (b.UsedPercent == nil || *u > *b.UsedPercent) {
				v := *u
				b.UsedPercent = &v
			}
		}
		if !b.Warn && b.UsedPercent != nil && *b.UsedPercent > most {
			most, e.Tightest = *b.UsedPercent, b.Order
		}
	}
}

// printTable prints the key, the budgets in reservation order, what is replaced and
// the tightest.
func (x *explainOptions) printTable(w io.Writer, e *Explained) error {
	fmt.Fprintf(w, "Key %s%s, model %s, route %s (%s), config generation %d, asked of %s.\n",
		e.APIKey, identity(e), dash(e.Model), e.Route, charged(e.Charged), e.Generation, replicas(int32(len(e.Replicas))))
	if len(e.Generations) > 0 {
		fmt.Fprintf(w, "Warning: the replicas run different config generations (%v): only the first one's answer is shown.\n", e.Generations)
	}
	if e.Bypass {
		_, err := fmt.Fprintln(w, "The key bypasses every budget: nothing applies.")
		return err
	}
	header := []string{"#", "BUDGET", "DIMENSION", "WINDOW", "AMOUNT", "LIMIT", "PER REPLICA", "USED", "NOTE"}
	if x.out.wide() {
		header = append(header, "RATE/S", "REPLICA RATE/S", "USED BY REPLICA")
	}
	var rows [][]string
	for i, b := range e.Budgets {
		row := []string{fmt.Sprint(b.Order), budgetName(&b), subject(&b), b.Window, b.Amount, number(b.Limit), number(b.ReplicaLimit), percent(b.UsedPercent), note(e, &b)}
		if x.out.wide() {
			row = append(row, rate(b.RatePerSecond), rate(b.ReplicaRatePerSecond), usedBy(e, i))
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "No budget applies to these requests.")
	} else if err := printTable(w, header, rows); err != nil {
		return err
	}
	printAttributes(w, e)
	printInFlight(w, e)
	for _, r := range e.Replaced {
		fmt.Fprintf(w, "%s is replaced by %s.\n", r.What, r.By)
	}
	if e.Tightest > 0 {
		b := e.Budgets[e.Tightest-1]
		fmt.Fprintf(w, "Tightest now: #%d %s %s, %s used.\n", b.Order, budgetName(&b), b.Window, percent(b.UsedPercent))
	}
	if slices.ContainsFunc(e.Budgets, func(b budget.Explained) bool { return b.LevelWithheld }) {
		fmt.Fprintln(w, "Use withheld: the platform's budgets' use is shown only to readers of the fleet's namespace.")
	}
	switch {
	case e.LevelsError != "":
		fmt.Fprintf(w, "Use not shown: %s.\n", e.LevelsError)
	case e.Levels == "memory" && e.Divisor > 1:
		fmt.Fprintf(w, "Memory storage: each replica enforces its share (PER REPLICA, 1/%d of LIMIT) on its own buckets; USED is the most used replica's.\n", e.Divisor)
	case e.Levels == "shared":
		fmt.Fprintln(w, "Redis storage: every replica draws on the fleet's totals (LIMIT); USED is the fleet's.")
	}
	for _, d := range e.Unresolved {
		switch d {
		case "client":
			fmt.Fprintln(w, "Budgets of each client address also apply: they depend on the caller's address, not the key.")
		case "model":
			fmt.Fprintln(w, "Budgets of models also apply: pass --model to see them.")
		}
	}
	return nil
}

// identity is the key's user and team, for the first line.
func identity(e *Explained) string {
	var parts []string
	if e.User != "" {
		parts = append(parts, "user "+e.User)
	}
	if e.Team != "" {
		parts = append(parts, "team "+e.Team)
	}
	if e.Tenant != "" {
		parts = append(parts, "tenant "+e.Tenant)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func charged(c bool) string {
	if c {
		return "charged"
	}
	return "not charged: request counts only"
}

// budgetName names a budget as the config does: a rule by its name (a TokenBudget's
// NAMESPACE/NAME), a limit by its dimension, a key's override as its own.
func budgetName(b *budget.Explained) string {
	switch b.Source {
	case "rule":
		return b.Rule
	case "api_key":
		return "the key's own"
	}
	return "limits per_" + b.Dimension
}

// subject is the dimension and the key's subject in it.
func subject(b *budget.Explained) string {
	s := b.Dimension
	if b.Subject != "" {
		s += " " + b.Subject
	}
	if b.CountBy != "" {
		s += " by " + b.CountBy + " " + b.By
	}
	return s
}

// note says what is notable of a budget: tightest, warn only, durable, what it
// replaces.
func note(e *Explained, b *budget.Explained) string {
	var n []string
	if b.Order == e.Tightest {
		n = append(n, "tightest")
	}
	if b.Warn {
		n = append(n, "warn only")
	}
	if b.LevelWithheld {
		n = append(n, "use withheld")
	}
	if b.ResetsAt != nil {
		n = append(n, "resets "+b.ResetsAt.UTC().Format("2006-01-02T15:04Z"))
	}
	if len(b.Replaces) > 0 {
		n = append(n, "replaces "+strings.Join(b.Replaces, ", "))
	}
	return dash(strings.Join(n, "; "))
}

// percent is a use: with a decimal below 10%, so that a little use shows.
func percent(p *float64) string {
	switch {
	case p == nil:
		return "-"
	case *p > 0 && *p < 10:
		return fmt.Sprintf("%.1f%%", *p)
	}
	return fmt.Sprintf("%.0f%%", *p)
}

// rate is a refill per second, to three decimals.
func rate(r float64) string {
	if r == 0 {
		return "-"
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", r), "0"), ".")
}

// usedBy is each replica's use of budget i.
func usedBy(e *Explained, i int) string {
	if i >= len(e.Used) {
		return "-"
	}
	parts := make([]string, 0, len(e.Used[i]))
	for j, u := range e.Used[i] {
		parts = append(parts, e.Replicas[j]+"="+percent(u))
	}
	return strings.Join(parts, ",")
}

// printAttributes says the request's attributes, what each budget that selects on or
// counts by one used and the counter it lands in, the values in the overflow subject,
// and the rules whose appliesWhen leaves the request out.
func printAttributes(w io.Writer, e *Explained) {
	uses := len(e.NotSelected) > 0 || slices.ContainsFunc(e.Budgets, func(b budget.Explained) bool { return len(b.Attributes) > 0 })
	if !uses {
		return
	}
	if len(e.Attributes) > 0 {
		names := slices.Sorted(maps.Keys(e.Attributes))
		parts := make([]string, 0, len(names))
		for _, n := range names {
			parts = append(parts, n+" "+e.Attributes[n])
		}
		fmt.Fprintf(w, "Request attributes: %s.\n", strings.Join(parts, ", "))
	}
	for i := range e.Budgets {
		b := &e.Budgets[i]
		if len(b.Attributes) == 0 {
			continue
		}
		var sel, by []string
		for _, a := range b.Attributes {
			if a.Use == "count_by" {
				by = append(by, attrValue(a))
			} else {
				sel = append(sel, attrValue(a))
			}
		}
		var uses []string
		if len(sel) > 0 {
			uses = append(uses, "selects "+strings.Join(sel, " and "))
		}
		if len(by) > 0 {
			uses = append(uses, "counts by "+strings.Join(by, " and "))
		}
		fmt.Fprintf(w, "#%d %s %s %s: counter %s.\n", b.Order, budgetName(b), b.Window, strings.Join(uses, ", "), subject(b))
		if b.Overflow {
			fmt.Fprintf(w, "#%d %s %s: the key has sent max_attribute_values (%d) other %s values this window: this one is counted in the overflow subject %s, which every further new value shares.\n",
				b.Order, budgetName(b), b.Window, e.MaxAttributeValues, b.CountBy, budget.Overflow)
		}
	}
	if e.ValuesError != "" {
		fmt.Fprintf(w, "Whether a value is beyond max_attribute_values is not shown: %s.\n", e.ValuesError)
	}
	for _, n := range e.NotSelected {
		fmt.Fprintf(w, "%s %s does not apply: %s is not one of %s.\n", n.Rule, n.Window, attrValue(n.Attribute), strings.Join(n.Values, ", "))
	}
}

// attrValue is an attribute and the request's value of it.
func attrValue(a budget.AttributeValue) string {
	switch {
	case a.Absent && slices.Contains([]string{"session", "agent", "task", "run"}, a.Attribute):
		return a.Attribute + " (none sent)"
	case a.Absent:
		return a.Attribute + " (none)"
	case a.Upstream != "" && a.Upstream != a.Value:
		return a.Attribute + " " + a.Value + " (upstream " + a.Upstream + ")"
	}
	return a.Attribute + " " + a.Value
}

// printInFlight says, for each in-flight window, the requests in flight now in the
// counter the request would take a slot of, of its limit, and whose they are: the
// fleet's under Redis storage, each replica's own under memory storage (or while the
// fleet's cannot be read).
func printInFlight(w io.Writer, e *Explained) {
	for i := range e.Budgets {
		b := &e.Budgets[i]
		if b.InFlight == nil {
			continue
		}
		head := fmt.Sprintf("#%d %s in flight: %d of %s", b.Order, budgetName(b), *b.InFlight, number(b.Limit))
		switch {
		case b.InFlightOf == "fleet":
			fmt.Fprintf(w, "%s, the fleet's: Redis storage, every replica's requests hold leased slots of one limit.\n", head)
		case len(e.Replicas) > 1:
			fmt.Fprintf(w, "%s on the busiest replica (%s): each replica holds the limit on its own, not divided.\n", head, inFlightBy(e, i))
		default:
			fmt.Fprintf(w, "%s on this replica: each replica holds the limit on its own, not divided.\n", head)
		}
	}
	if e.InFlightError != "" {
		fmt.Fprintf(w, "The fleet's requests in flight were not read (%s): the counts are the replica's own, which decide while the fleet's cannot.\n", e.InFlightError)
	}
}

// inFlightBy is each replica's requests in flight in budget i.
func inFlightBy(e *Explained, i int) string {
	parts := make([]string, 0, len(e.Replicas))
	for j, n := range e.InFlight[i] {
		v := "-"
		if n != nil {
			v = fmt.Sprint(*n)
		}
		parts = append(parts, e.Replicas[j]+" "+v)
	}
	return strings.Join(parts, ", ")
}
