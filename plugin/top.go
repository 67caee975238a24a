// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/watch"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
)

// topOptions are the flags of `top`.
type topOptions struct {
	*Options
	out   *outputFlags
	all   bool
	fleet string
	watch bool
}

func newTopCommand(o *Options) *cobra.Command {
	t := &topOptions{Options: o, out: newOutputFlags()}
	cmd := &cobra.Command{
		Use:   "top [keys|budgets]",
		Short: "Keys, users, teams and clients (or budgets) ranked by how much of their tightest budget they use now",
		Long: `top ranks by the fleets' live usage, as the TokenBudgets' status holds it (what kubectl get tb reads).

  keys (the default)  each subject a budget's status names (its most used subject, per window), with
                      the budget it uses most of: keys, users, teams and clients
  budgets             each budget with its most used window and its top consumer

FULL IN is how long the window takes to be whole again with no more use: a rolling window refills
continuously, a calendar window starts again at its next start (reset). Like kubectl top, top reads the
current namespace (-n), or every namespace with -A, and shows what RBAC lets the caller list.`,
		Args:      cobra.MaximumNArgs(1),
		ValidArgs: []string{"keys", "budgets"},
		RunE: func(cmd *cobra.Command, args []string) error {
			what := "keys"
			if len(args) == 1 {
				what = args[0]
			}
			if what != "keys" && what != "budgets" {
				return fmt.Errorf("top shows keys or budgets, not %q", what)
			}
			return t.run(cmd.Context(), what)
		},
	}
	t.out.addFlags(cmd)
	cmd.Flags().BoolVarP(&t.all, "all-namespaces", "A", false, "Read the budgets of every namespace.")
	cmd.Flags().StringVar(&t.fleet, "fleet", "", "Only the budgets of this fleet (TokenProxy NAME, or NAMESPACE/NAME).")
	cmd.Flags().BoolVarP(&t.watch, "watch", "w", false, "After the first ranking, print it again each time it changes.")
	return cmd
}

// UsageRow is one window's use, as top prints it: a subject's (or the budget's own
// counter's) use of one window of one budget.
type UsageRow struct {
	Namespace string `json:"namespace"`
	Budget    string `json:"budget"`
	// Fleet is the budget's TokenProxy, NAMESPACE/NAME.
	Fleet string `json:"fleet"`
	// Subject is the key, user, team or client (and its countBy value after a comma);
	// empty for a budget with one counter for the fleet or a model.
	Subject string `json:"subject,omitempty"`
	// Kind is what the subject is: key, user, team, client, model or fleet.
	Kind string `json:"kind"`
	// UsedPercent is the part of the window's allowance in use; absent where the
	// status shows no level (a per-subject budget of another namespace).
	UsedPercent *int32 `json:"usedPercent,omitempty"`
	// Used is the amount in use: "3k", "12 req", "$12.50".
	Used string `json:"used,omitempty"`
	// Window is the window in words: "30k/min", "$1000/month".
	Window string `json:"window"`
	// RefillSeconds is how long a rolling window takes to refill with no more use.
	RefillSeconds int64 `json:"refillSeconds,omitempty"`
	// ResetsAt is when a calendar window starts again.
	ResetsAt *metav1.Time `json:"resetsAt,omitempty"`
	// SubjectsAtLimit and Refused are the budget's counts for the window.
	SubjectsAtLimit *int32 `json:"subjectsAtLimit,omitempty"`
	Refused         int64  `json:"refused,omitempty"`
	// ObservedAt is when the operator summed the figures.
	ObservedAt metav1.Time `json:"observedAt"`
}

func (t *topOptions) run(ctx context.Context, what string) error {
	c, err := t.client()
	if err != nil {
		return err
	}
	sc := scope{all: t.all}
	if !t.all {
		if sc.namespace, err = t.namespace(); err != nil {
			return err
		}
	}
	var last []byte
	show := func() error {
		var list twv1alpha1.TokenBudgetList
		if err := c.List(ctx, &list, sc.listOptions()...); err != nil {
			return readError(err, "list", "tokenbudgets.tokenwarden.io", sc.where())
		}
		rows := t.rank(list.Items, what)
		var buf bytes.Buffer
		if err := t.print(&buf, rows, what, sc); err != nil {
			return err
		}
		if bytes.Equal(buf.Bytes(), last) {
			return nil
		}
		if last != nil && t.out.table() {
			fmt.Fprintln(t.Streams.Out)
		}
		last = buf.Bytes()
		_, err := t.Streams.Out.Write(last)
		return err
	}
	if err := show(); err != nil || !t.watch {
		return err
	}
	for {
		w, err := c.Watch(ctx, &twv1alpha1.TokenBudgetList{}, sc.listOptions()...)
		if err != nil {
			return readError(err, "watch", "tokenbudgets.tokenwarden.io", sc.where())
		}
		if err := t.follow(ctx, w, show); err != nil || ctx.Err() != nil {
			return err
		}
	}
}

// follow prints the ranking again after each event of w, until w ends.
func (t *topOptions) follow(ctx context.Context, w watch.Interface, show func() error) error {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil
			}
			if ev.Type == watch.Error {
				return nil // an expired watch: watch again
			}
			if err := show(); err != nil {
				return err
			}
		}
	}
}

// rank are the rows of `top keys` or `top budgets`, the most used first.
func (t *topOptions) rank(budgets []twv1alpha1.TokenBudget, what string) []UsageRow {
	now := t.Now()
	var rows []UsageRow
	for i := range budgets {
		b := &budgets[i]
		if t.fleet != "" && t.fleet != fleetOf(b) && t.fleet != b.Spec.ProxyRef.Name {
			continue
		}
		figures := usageRows(b, now)
		if what == "budgets" {
			if r, ok := tightest(figures); ok {
				rows = append(rows, r)
			}
			continue
		}
		rows = append(rows, subjectRows(figures)...)
	}
	if what == "keys" {
		rows = perSubject(rows)
	}
	slices.SortStableFunc(rows, func(a, b UsageRow) int {
		if d := percentOf(b) - percentOf(a); d != 0 {
			return int(d)
		}
		return strings.Compare(a.Namespace+"/"+a.Budget+"/"+a.Subject, b.Namespace+"/"+b.Budget+"/"+b.Subject)
	})
	return rows
}

// percentOf is a row's used percentage, -1 when it shows none.
func percentOf(r UsageRow) int32 {
	if r.UsedPercent == nil {
		return -1
	}
	return *r.UsedPercent
}

// tightest is the row of the most used window; false when none shows use.
func tightest(rows []UsageRow) (UsageRow, bool) {
	best := -1
	for i, r := range rows {
		if best < 0 || percentOf(r) > percentOf(rows[best]) {
			best = i
		}
	}
	if best < 0 {
		return UsageRow{}, false
	}
	return rows[best], true
}

// subjectRows are the rows that name a subject of a per-subject budget.
func subjectRows(rows []UsageRow) []UsageRow {
	var out []UsageRow
	for _, r := range rows {
		if r.Subject != "" && r.UsedPercent != nil && r.Kind != "model" && r.Kind != "fleet" {
			out = append(out, r)
		}
	}
	return out
}

// perSubject keeps each subject's tightest row: the window of its fleet it uses most of.
func perSubject(rows []UsageRow) []UsageRow {
	best := map[string]int{}
	var out []UsageRow
	for _, r := range rows {
		k := r.Fleet + "|" + r.Kind + "|" + r.Subject
		if i, ok := best[k]; ok {
			if percentOf(r) > percentOf(out[i]) {
				out[i] = r
			}
			continue
		}
		best[k] = len(out)
		out = append(out, r)
	}
	return out
}

// fleetOf is a budget's TokenProxy, NAMESPACE/NAME.
func fleetOf(b *twv1alpha1.TokenBudget) string {
	ns := b.Spec.ProxyRef.Namespace
	if ns == "" {
		ns = b.Namespace
	}
	return ns + "/" + b.Spec.ProxyRef.Name
}

var kinds = map[twv1alpha1.Dimension]string{
	twv1alpha1.DimensionGlobal: "fleet", twv1alpha1.DimensionPerClient: "client", twv1alpha1.DimensionPerAPIKey: "key",
	twv1alpha1.DimensionPerUser: "user", twv1alpha1.DimensionPerTeam: "team", twv1alpha1.DimensionPerModel: "model",
}

var countByKinds = map[twv1alpha1.CountBy]string{
	twv1alpha1.CountByAPIKey: "key", twv1alpha1.CountByUser: "user", twv1alpha1.CountByTeam: "team",
	twv1alpha1.CountByModel: "model", twv1alpha1.CountByClient: "client",
}

// kindOf is what a budget's subjects are: "key", or "team per model" with countBy.
func kindOf(b *twv1alpha1.TokenBudget) string {
	k := kinds[b.Spec.Dimension]
	if b.Spec.CountBy != "" {
		k += " per " + countByKinds[b.Spec.CountBy]
	}
	return k
}

// usageRows are a budget's figures, one per window its status shows.
func usageRows(b *twv1alpha1.TokenBudget, now time.Time) []UsageRow {
	u := b.Status.Usage
	if u == nil {
		return nil
	}
	ws := windowsOf(b)
	base := UsageRow{Namespace: b.Namespace, Budget: b.Name, Fleet: fleetOf(b), Kind: kindOf(b), ObservedAt: u.ObservedAt}
	if len(u.Windows) > 0 {
		return ruleRows(b, base, ws, now)
	}
	return limitRows(b, base, ws, now)
}

// ruleRows are the figures of a budget in the rule shape: one per window.
func ruleRows(b *twv1alpha1.TokenBudget, base UsageRow, ws []window, now time.Time) []UsageRow {
	var out []UsageRow
	single := ""
	if b.Spec.CountBy == "" {
		switch subjects := namedSubjects(b); {
		case b.Spec.Dimension == twv1alpha1.DimensionGlobal:
		case len(subjects) == 1:
			single = subjects[0]
		}
	}
	for _, wu := range b.Status.Usage.Windows {
		r := base
		r.Window, r.Used, r.UsedPercent = wu.Window, wu.Used, wu.UsedPercent
		r.SubjectsAtLimit, r.Refused = wu.SubjectsAtLimit, wu.Refused
		r.Subject = wu.TopConsumer
		if single != "" {
			r.Subject = single
		}
		if w, ok := byText(ws, wu.Window); ok && r.UsedPercent != nil {
			setBack(&r, w, *r.UsedPercent, now)
		}
		out = append(out, r)
	}
	return out
}

// namedSubjects are a budget's named subjects: its subjects, or a PerModel budget's model.
func namedSubjects(b *twv1alpha1.TokenBudget) []string {
	if len(b.Spec.Subjects) > 0 {
		return b.Spec.Subjects
	}
	if b.Spec.Model != "" {
		return []string{b.Spec.Model}
	}
	return nil
}

// limitRows are the figures of a budget of the minute-and-day shape: the minute and
// the day. The top consumer is the subject of the more used one.
func limitRows(b *twv1alpha1.TokenBudget, base UsageRow, ws []window, now time.Time) []UsageRow {
	u := b.Status.Usage
	perSubject := kinds[b.Spec.Dimension] != "fleet" && kinds[b.Spec.Dimension] != "model"
	var out []UsageRow
	add := func(p *twv1alpha1.PeriodUsage, w window, refused int64) {
		if p == nil {
			return
		}
		r := base
		r.Window, r.UsedPercent, r.Used, r.Refused = w.text, &p.UsedPercent, compact(p.UsedTokens), refused
		if perSubject {
			r.SubjectsAtLimit = u.SubjectsAtLimit
		} else if b.Spec.Model != "" {
			r.Subject = b.Spec.Model
		}
		setBack(&r, w, p.UsedPercent, now)
		out = append(out, r)
	}
	// The shorthand's windows come minute first, then day (windowsOf).
	var minute, day window
	if b.Spec.TokensPerMinute > 0 && len(ws) > 0 {
		minute, ws = ws[0], ws[1:]
	}
	if b.Spec.TokensPerDay > 0 && len(ws) > 0 {
		day = ws[0]
	}
	add(u.Minute, minute, u.Refusals.Minute)
	add(u.Day, day, u.Refusals.Day)
	if perSubject && u.TopConsumer != "" {
		if i, ok := mostUsed(out); ok {
			out[i].Subject = u.TopConsumer
		}
	}
	return out
}

// mostUsed is the index of the row with the largest used percentage.
func mostUsed(rows []UsageRow) (int, bool) {
	best := -1
	for i, r := range rows {
		if best < 0 || percentOf(r) > percentOf(rows[best]) {
			best = i
		}
	}
	return best, best >= 0
}

// setBack sets when the row's window is whole again.
func setBack(r *UsageRow, w window, usedPercent int32, now time.Time) {
	refill, resets := w.back(usedPercent, now)
	r.RefillSeconds = int64(refill.Seconds())
	if !resets.IsZero() {
		r.ResetsAt = &metav1.Time{Time: resets}
	}
}

// fullIn is the FULL IN column: the refill time, or the time to the reset.
func fullIn(r UsageRow, now time.Time) string {
	switch {
	case r.ResetsAt != nil:
		return duration.HumanDuration(r.ResetsAt.Sub(now)) + " (reset)"
	case r.RefillSeconds > 0:
		return duration.HumanDuration(secondsOf(r.RefillSeconds))
	}
	return ""
}

// secondsOf is n seconds.
func secondsOf(n int64) time.Duration { return time.Duration(n) * time.Second }

// compact writes a number of tokens short when that loses nothing: 600k, 2.4M, 1666666,
// as the budgets' status does.
func compact(n int64) string {
	for _, u := range []struct {
		size int64
		unit string
	}{{1_000_000_000, "G"}, {1_000_000, "M"}, {1_000, "k"}} {
		if n >= u.size && n%(u.size/100) == 0 {
			return strconv.FormatFloat(float64(n)/float64(u.size), 'f', -1, 64) + u.unit
		}
	}
	return strconv.FormatInt(n, 10)
}

// print writes the rows as -o asks.
func (t *topOptions) print(w io.Writer, rows []UsageRow, what string, sc scope) error {
	if !t.out.table() {
		return t.out.printRows(w, rows)
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintf(w, "No budget shows use %s.\n", sc.where())
		return err
	}
	header := []string{"SUBJECT", "KIND", "USED", "WINDOW", "FULL IN", "BUDGET"}
	if what == "budgets" {
		header = []string{"BUDGET", "USED", "WINDOW", "FULL IN", "TOP CONSUMER", "AT LIMIT"}
	}
	if t.out.wide() {
		header = append(header, "AMOUNT", "REFUSED", "FLEET", "OBSERVED AT")
	}
	if sc.all {
		header = append([]string{"NAMESPACE"}, header...)
	}
	now := t.Now()
	var cells [][]string
	for _, r := range rows {
		used := "-"
		if r.UsedPercent != nil {
			used = fmt.Sprintf("%d%%", *r.UsedPercent)
		}
		row := []string{r.Subject, r.Kind, used, r.Window, fullIn(r, now), r.Budget}
		if what == "budgets" {
			row = []string{r.Budget, used, r.Window, fullIn(r, now), r.Subject, count(r.SubjectsAtLimit)}
		}
		if t.out.wide() {
			row = append(row, r.Used, strconv.FormatInt(r.Refused, 10), r.Fleet, r.ObservedAt.UTC().Format(time.RFC3339))
		}
		if sc.all {
			row = append([]string{r.Namespace}, row...)
		}
		cells = append(cells, row)
	}
	return printTable(w, header, cells)
}

// count is an optional count, empty when absent.
func count(n *int32) string {
	if n == nil {
		return ""
	}
	return strconv.Itoa(int(*n))
}
