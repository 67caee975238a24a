// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/proxy/report"
)

// DefaultUsageInterval is the shortest time between two writes of one TokenBudget's
// status.usage.
const DefaultUsageInterval = 15 * time.Second

// Thresholds of a meaningful usage change: what makes the operator write a budget's
// status.usage (at most once per interval).
const (
	// usagePoints is the change of a period's used percentage worth a write.
	usagePoints = 5
)

// usageReconciler writes each TokenBudget's status.usage from its fleet's usage
// reports (the ReplicaUsageAnnotation of the live replicas' Leases). It is a
// controller of its own, woken only by a report that changed: the fleet reconciler
// never runs for usage, and a fleet whose use does not change costs no write.
type usageReconciler struct {
	client.Client
	events events.EventRecorder
	// now is the controller's clock: the forecast's samples are taken at its times.
	now      func() time.Time
	interval time.Duration
	// written is when each budget's usage was last written, by UID.
	mu      sync.Mutex
	written map[types.UID]time.Time
}

// setupUsage registers the usage controller. It uses the fleet reconciler's indexes.
func (r *TokenProxyReconciler) setupUsage(mgr ctrl.Manager) error {
	interval := r.UsageInterval
	if interval <= 0 {
		interval = DefaultUsageInterval
	}
	ur := &usageReconciler{Client: mgr.GetClient(), events: r.Events, now: time.Now, interval: interval, written: map[types.UID]time.Time{}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("tokenbudget-usage").
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(r.proxyOfLease),
			builder.WithPredicates(usageReportChanged())).
		Watches(&twv1alpha1.TokenBudget{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []ctrl.Request {
			return []ctrl.Request{{NamespacedName: render.ProxyOf(o)}}
		}), builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, forecastConditionLost()))).
		Complete(ur)
}

// usageReportChanged passes a replica arriving or leaving, or a usage report that
// changed; not a renewal.
func usageReportChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetAnnotations()[twv1alpha1.ReplicaUsageAnnotation] != e.ObjectNew.GetAnnotations()[twv1alpha1.ReplicaUsageAnnotation]
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// forecastConditionLost passes a TokenBudget whose status holds a forecast without
// its ProjectedToRunOut condition: the fleet reconciler's write of the conditions,
// from a copy read before this controller's, replaced the list without it.
func forecastConditionLost() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		DeleteFunc: func(event.DeleteEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			b, ok := e.ObjectNew.(*twv1alpha1.TokenBudget)
			return ok && b.Status.Forecast != nil &&
				meta.FindStatusCondition(b.Status.Conditions, twv1alpha1.ConditionProjectedToRunOut) == nil
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// Reconcile sums one fleet's usage reports into its budgets' statuses.
func (r *usageReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var tp twv1alpha1.TokenProxy
	if err := r.Get(ctx, req.NamespacedName, &tp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var leases coordinationv1.LeaseList
	if err := r.List(ctx, &leases, client.InNamespace(tp.Namespace),
		client.MatchingLabels{twv1alpha1.ReplicaConfigMapLabel: proxyName(&tp)}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list Leases: %w", err)
	}
	now := r.now()
	var reports []indexedReport
	for i := range leases.Items {
		le := &leases.Items[i]
		if !live(le, now) {
			continue
		}
		var u report.Usage
		if err := json.Unmarshal([]byte(le.Annotations[twv1alpha1.ReplicaUsageAnnotation]), &u); err != nil {
			continue // a replica without a report (yet), or an older proxy
		}
		reports = append(reports, index(&u))
	}
	if len(reports) == 0 {
		// Nothing is known of the fleet's use: the last figures stay, with their time.
		return ctrl.Result{}, nil
	}
	var budgets twv1alpha1.TokenBudgetList
	if err := r.List(ctx, &budgets, client.MatchingFields{proxyRefField: req.String()}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list TokenBudgets: %w", err)
	}
	var requeue time.Duration
	for i := range budgets.Items {
		b := &budgets.Items[i]
		var want *twv1alpha1.TokenBudgetUsage
		// The replicas report the buckets of the config's limits by dimension and
		// model, and a budget in the rule shape by its rules' windows.
		if meta.IsStatusConditionTrue(b.Status.Conditions, twv1alpha1.ConditionAccepted) {
			if render.RendersAsRules(&tp, b) {
				want = sumRuleUsage(&tp, b, reports, now)
			} else {
				want = sumUsage(b, reports, now)
			}
		}
		var forecast *twv1alpha1.BudgetForecast
		if want != nil {
			forecast = budgetForecast(&tp, b, reports, now)
		}
		var cond *metav1.Condition
		if forecast != nil {
			cond = ptr.To(forecastCondition(forecast, b.Generation))
		}
		condMoved := cond != nil && conditionChanged(b.Status.Conditions, *cond) ||
			cond == nil && meta.FindStatusCondition(b.Status.Conditions, twv1alpha1.ConditionProjectedToRunOut) != nil
		if !meaningful(b.Status.Usage, want) && !forecastMoved(b.Status.Forecast, forecast) && !condMoved {
			continue
		}
		if wait := r.due(b, now); wait > 0 && !condMoved {
			requeue = minPositive(requeue, wait)
			continue
		}
		if err := r.writeUsage(ctx, b, want, forecast, cond); err != nil {
			return ctrl.Result{}, err
		}
		r.mu.Lock()
		r.written[b.UID] = now
		r.mu.Unlock()
	}
	r.forgetGone(budgets.Items)
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// writeUsage patches a budget's usage, forecast and ProjectedToRunOut condition
// (removed when cond is nil), and records an event when the condition turns True. A
// budget that is gone is no error.
func (r *usageReconciler) writeUsage(ctx context.Context, b *twv1alpha1.TokenBudget, usage *twv1alpha1.TokenBudgetUsage,
	forecast *twv1alpha1.BudgetForecast, cond *metav1.Condition) error {
	wasTrue := meta.IsStatusConditionTrue(b.Status.Conditions, twv1alpha1.ConditionProjectedToRunOut)
	// The conditions are a list a merge patch replaces whole: the fleet reconciler's
	// concurrent change of another condition must make this write conflict, not vanish.
	patch := client.MergeFromWithOptions(b.DeepCopy(), client.MergeFromWithOptimisticLock{})
	b.Status.Usage, b.Status.Forecast = usage, forecast
	if cond != nil {
		meta.SetStatusCondition(&b.Status.Conditions, *cond)
	} else {
		meta.RemoveStatusCondition(&b.Status.Conditions, twv1alpha1.ConditionProjectedToRunOut)
	}
	if err := r.Status().Patch(ctx, b, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patch the usage of TokenBudget %s: %w", render.DisplayName(b), err)
	}
	if cond != nil && cond.Status == metav1.ConditionTrue && !wasTrue && r.events != nil {
		r.events.Eventf(b, nil, corev1.EventTypeWarning, twv1alpha1.ReasonProjectedToRunOut, "Forecast", "%s",
			truncate(cond.Message, eventNoteLimit))
	}
	return nil
}

// live reports whether a replica's Lease is renewed (on its own clock; the fleet
// reconciler tells skewed clocks apart for Enforced, usage needs no such care).
func live(le *coordinationv1.Lease, now time.Time) bool {
	if !le.DeletionTimestamp.IsZero() || le.Spec.RenewTime == nil || le.Spec.LeaseDurationSeconds == nil {
		return false
	}
	return le.Spec.RenewTime.Add(time.Duration(*le.Spec.LeaseDurationSeconds) * time.Second).After(now)
}

// due returns how long a budget's usage must wait before it may be written again.
func (r *usageReconciler) due(b *twv1alpha1.TokenBudget, now time.Time) time.Duration {
	r.mu.Lock()
	last := r.written[b.UID]
	r.mu.Unlock()
	if u := b.Status.Usage; u != nil && u.ObservedAt.After(last) {
		last = u.ObservedAt.Time
	}
	if last.IsZero() {
		return 0
	}
	return last.Add(r.interval).Sub(now)
}

// forgetGone drops the write times of budgets that are gone (only this fleet's).
func (r *usageReconciler) forgetGone(present []twv1alpha1.TokenBudget) {
	// Budgets move between fleets rarely; a map entry is 40 bytes: prune only this
	// fleet's known set when it is much smaller than the map.
	keep := make(map[types.UID]bool, len(present))
	for i := range present {
		keep[present[i].UID] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.written) <= 4*len(keep)+64 {
		return
	}
	for uid := range r.written {
		if !keep[uid] {
			delete(r.written, uid)
		}
	}
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || b < a {
		return b
	}
	return a
}

// reportSlot is the budget package's name of a TokenBudget's dimension, and whether
// the dimension has one bucket per subject.
func reportSlot(d twv1alpha1.Dimension) (name string, perSubject bool) {
	switch d {
	case twv1alpha1.DimensionGlobal:
		return "global", false
	case twv1alpha1.DimensionPerModel:
		return "model", false
	case twv1alpha1.DimensionPerClient:
		return "client", true
	case twv1alpha1.DimensionPerAPIKey:
		return "api_key", true
	case twv1alpha1.DimensionPerUser:
		return "user", true
	case twv1alpha1.DimensionPerTeam:
		return "team", true
	}
	return "", false
}

// indexedReport is a replica's report with its budgets by dimension and model: a
// fleet's reconcile looks each of its budgets up in each report once.
type indexedReport struct {
	*report.Usage
	budgets map[[2]string]*report.BudgetUsage
	rules   map[ruleWindow]*report.RuleUsage
}

func index(u *report.Usage) indexedReport {
	ir := indexedReport{Usage: u, budgets: make(map[[2]string]*report.BudgetUsage, len(u.Budgets)),
		rules: make(map[ruleWindow]*report.RuleUsage, len(u.Rules))}
	for i := range u.Budgets {
		ir.budgets[[2]string{u.Budgets[i].Dimension, u.Budgets[i].Model}] = &u.Budgets[i]
	}
	for i := range u.Rules {
		ir.rules[ruleWindow{u.Rules[i].Rule, u.Rules[i].Window}] = &u.Rules[i]
	}
	return ir
}

// subjectPeriod is one subject's use of one period, summed over the reports.
type subjectPeriod struct {
	used, capacity float64
}

// sumUsage sums the reports' entries of one budget. Reports read from the shared
// (Redis) buckets each hold the fleet's whole use, so they are not added up: the
// largest is taken. Reports of a replica's memory hold its share, and are added up.
func sumUsage(b *twv1alpha1.TokenBudget, reports []indexedReport, now time.Time) *twv1alpha1.TokenBudgetUsage {
	dim, perSubject := reportSlot(b.Spec.Dimension)
	model := b.Spec.Model
	divisor := max(b.Status.Replicas, 1)
	u := &twv1alpha1.TokenBudgetUsage{ObservedAt: metav1.NewTime(now)}
	var minute, day [2]float64 // used: [memory sum, shared max]
	tops := map[[2]string]*subjectPeriod{}
	sharedTops := map[[2]string]*subjectPeriod{}
	var atLimit int
	for _, rep := range reports {
		u.Refusals.IntervalSeconds = max(u.Refusals.IntervalSeconds, rep.Window)
		e := rep.budgets[[2]string{dim, model}]
		if e == nil {
			if rep.Cut > 0 {
				u.Partial = true
			}
			continue
		}
		if e.Refused != nil {
			u.Refusals.Minute += e.Refused.Minute
			u.Refusals.Day += e.Refused.Day
			u.Refusals.Requests += e.Refused.Requests
		}
		atLimit = max(atLimit, e.AtLimit)
		addLevel := func(acc *[2]float64, l *report.Level) {
			if l == nil {
				return
			}
			if rep.Shared {
				acc[1] = max(acc[1], float64(l.Used))
			} else {
				acc[0] += float64(l.Used)
			}
		}
		addLevel(&minute, e.Minute)
		addLevel(&day, e.Day)
		for _, t := range e.Top {
			k := [2]string{t.ID, t.Period}
			if rep.Shared {
				sp := sharedTops[k]
				if sp == nil {
					sp = &subjectPeriod{}
					sharedTops[k] = sp
				}
				sp.used, sp.capacity = max(sp.used, float64(t.Used)), float64(t.Capacity)
				continue
			}
			sp := tops[k]
			if sp == nil {
				sp = &subjectPeriod{}
				tops[k] = sp
			}
			// A replica's bucket holds its share: the subject's fleet allowance is the
			// share times the divisor.
			sp.used += float64(t.Used)
			sp.capacity = float64(t.Capacity * divisor)
		}
	}
	for k, sp := range sharedTops {
		if m := tops[k]; m == nil || sp.used > m.used {
			tops[k] = sp
		}
	}

	foreignBudget := render.Foreign(b)
	if !perSubject {
		u.Minute = periodUsage(minute[0]+minute[1], float64(b.Spec.TokensPerMinute))
		u.Day = periodUsage(day[0]+day[1], float64(b.Spec.TokensPerDay))
	} else {
		u.SubjectsAtLimit = ptr.To(int32(min(atLimit, math.MaxInt32))) //nolint:gosec // bounded just above
		if !foreignBudget {
			var best [2]string
			bestFrac := -1.0
			for _, period := range []string{"minute", "day"} {
				var pk [2]string
				pf := -1.0
				for k, sp := range tops {
					if k[1] != period || sp.capacity <= 0 {
						continue
					}
					if f := sp.used / sp.capacity; f > pf || (f == pf && k[0] < pk[0]) {
						pk, pf = k, f
					}
				}
				if pf < 0 {
					continue
				}
				pu := periodUsage(tops[pk].used, tops[pk].capacity)
				if period == "minute" {
					u.Minute = pu
				} else {
					u.Day = pu
				}
				if pf > bestFrac || (pf == bestFrac && pk[0] < best[0]) {
					best, bestFrac = pk, pf
				}
			}
			if bestFrac >= 0 {
				u.TopConsumer = subjectName(b.Spec.Dimension, best[0])
			}
		}
	}
	var most int32 = -1
	for _, p := range []*twv1alpha1.PeriodUsage{u.Minute, u.Day} {
		if p != nil {
			most = max(most, p.UsedPercent)
		}
	}
	if most >= 0 {
		u.Used = fmt.Sprintf("%d%%", most) // at most 11 characters: an int32 and %
	}
	return u
}

// periodUsage is a period's use of an allowance; nil for an unlimited period.
func periodUsage(used, allowance float64) *twv1alpha1.PeriodUsage {
	if allowance <= 0 {
		return nil
	}
	// A bucket is at most one capacity in debt: 200%. More is a report the proxy did
	// not write; it is shown as it is, within the field's range.
	used = max(used, 0)
	pct := math.Round(100 * used / allowance)
	return &twv1alpha1.PeriodUsage{UsedPercent: int32(min(pct, math.MaxInt32)), UsedTokens: int64(min(used, math.MaxInt64))}
}

// subjectName is how status names a subject: an ApiKey of another namespace, which
// the config names namespace_name, as namespace/name. A name longer than any subject
// can be (a report a replica did not write as the proxy does) is cut to what the
// field holds.
func subjectName(d twv1alpha1.Dimension, id string) string {
	if d == twv1alpha1.DimensionPerAPIKey {
		if ns, name, ok := strings.Cut(id, "_"); ok {
			id = ns + "/" + name
		}
	}
	if len(id) > maxSubjectName {
		id = id[:maxSubjectName]
	}
	return id
}

// maxSubjectName is the longest topConsumer the CRD admits.
const maxSubjectName = 253

// meaningful reports whether want differs enough from the status's usage to be
// written: a period's used percentage moved by usagePoints or more, the period
// appeared or went, or its use started or ended, the subjects at their limit or the top consumer changed, or a
// refusal count started, stopped, doubled or halved. An unused budget that shows no
// usage yet is left without.
func meaningful(have, want *twv1alpha1.TokenBudgetUsage) bool {
	switch {
	case have == nil && want == nil:
		return false
	case have == nil:
		return !idle(want)
	case want == nil:
		return true
	}
	for _, p := range [][2]*twv1alpha1.PeriodUsage{{have.Minute, want.Minute}, {have.Day, want.Day}} {
		if (p[0] == nil) != (p[1] == nil) {
			return true
		}
		if p[0] != nil && (abs(p[0].UsedPercent-p[1].UsedPercent) >= usagePoints || (p[0].UsedTokens > 0) != (p[1].UsedTokens > 0)) {
			return true
		}
	}
	if ptr.Deref(have.SubjectsAtLimit, -1) != ptr.Deref(want.SubjectsAtLimit, -1) || have.TopConsumer != want.TopConsumer ||
		have.Partial != want.Partial {
		return true
	}
	h, w := have.Refusals, want.Refusals
	for _, c := range [][2]int64{{h.Minute, w.Minute}, {h.Day, w.Day}, {h.Requests, w.Requests}} {
		if countMoved(c[0], c[1]) {
			return true
		}
	}
	if len(have.Windows) != len(want.Windows) {
		return true
	}
	for i := range have.Windows {
		hw, ww := &have.Windows[i], &want.Windows[i]
		hp, wp := hw.UsedPercent, ww.UsedPercent
		if hw.Window != ww.Window || (hp == nil) != (wp == nil) || hp != nil && abs(*hp-*wp) >= usagePoints || (hw.Used == "") != (ww.Used == "") ||
			ptr.Deref(hw.SubjectsAtLimit, -1) != ptr.Deref(ww.SubjectsAtLimit, -1) || hw.TopConsumer != ww.TopConsumer ||
			countMoved(hw.Refused, ww.Refused) {
			return true
		}
	}
	return false
}

// countMoved reports whether a refusal count started, stopped, doubled or halved.
func countMoved(have, want int64) bool {
	return (have == 0) != (want == 0) || want >= 2*have && have > 0 || have >= 2*want && want > 0
}

// idle reports whether a usage shows no use and no refusal.
func idle(u *twv1alpha1.TokenBudgetUsage) bool {
	for _, p := range []*twv1alpha1.PeriodUsage{u.Minute, u.Day} {
		if p != nil && p.UsedTokens > 0 {
			return false
		}
	}
	for _, w := range u.Windows {
		if w.Used != "" || w.Refused > 0 || ptr.Deref(w.SubjectsAtLimit, 0) > 0 {
			return false
		}
	}
	r := u.Refusals
	return ptr.Deref(u.SubjectsAtLimit, 0) == 0 && u.TopConsumer == "" && r.Minute+r.Day+r.Requests == 0
}

func abs(n int32) int32 {
	if n < 0 {
		return -n
	}
	return n
}
