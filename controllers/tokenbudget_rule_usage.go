// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package controllers

import (
	"fmt"
	"math"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	twv1alpha1 "github.com/tokenwarden/tokenwarden/api/v1alpha1"
	"github.com/tokenwarden/tokenwarden/controllers/render"
	"github.com/tokenwarden/tokenwarden/proxy/config"
)

// ruleWindow is one window of a rule in the replicas' reports: the rule's name and
// the window's index.
type ruleWindow struct {
	rule   string
	window int
}

// counterOf is one counter of a rule window: its subject and count_by value.
type counterOf struct{ id, by string }

// oneCounter reports whether a rule-shaped budget has one counter for the fleet per
// window: Global, or one named subject (a PerModel budget's model), without countBy.
func oneCounter(b *twv1alpha1.TokenBudget) bool {
	if b.Spec.CountBy != "" {
		return false
	}
	return b.Spec.Dimension == twv1alpha1.DimensionGlobal || len(render.SubjectsOf(b)) == 1
}

// windowCapacity is what a window's counter holds for the fleet: a rolling window's
// limit over its burst, a calendar window's limit.
func windowCapacity(w config.Window) float64 {
	if r := w.Rolling; r != nil && r.BurstSeconds > 0 {
		return w.Limit * r.BurstSeconds / r.Period.Duration().Seconds()
	}
	return w.Limit
}

// sumRuleUsage sums the reports' entries of a budget in the rule shape: each of its
// rules' windows. As for limits, reports of the shared (Redis) counters each hold the
// fleet's whole use and the largest is taken; reports of a replica's memory hold its
// share of each rolling counter, and are added up.
//
// A budget of another namespace than fleet tp's under Flat has a counter for every
// tenant's subjects, so it shows none of them; a tenant's own budget under Namespaces
// counts its own tenant's subjects only, and shows them.
func sumRuleUsage(tp *twv1alpha1.TokenProxy, b *twv1alpha1.TokenBudget, reports []indexedReport, now time.Time) *twv1alpha1.TokenBudgetUsage {
	u := &twv1alpha1.TokenBudgetUsage{ObservedAt: metav1.NewTime(now)}
	single, hide := oneCounter(b), render.Foreign(b) && !render.Scoped(tp, b)
	most, mostAt, bestFrac := int32(-1), int32(-1), -1.0
	for _, g := range render.Groups(b) {
		rule := b.Namespace + "/" + b.Name + g.Suffix
		for i, w := range g.Windows {
			key := ruleWindow{rule, i}
			used := map[counterOf][2]float64{} // [memory sum, shared max]
			var refused int64
			atLimit := 0
			for _, rep := range reports {
				u.Refusals.IntervalSeconds = max(u.Refusals.IntervalSeconds, rep.Window)
				e := rep.rules[key]
				if e == nil {
					if rep.Cut > 0 {
						u.Partial = true
					}
					continue
				}
				if e.Refused > 0 {
					// A count no replica could reach (a false report) saturates.
					refused = min(refused, math.MaxInt64-e.Refused) + e.Refused
				}
				atLimit = max(atLimit, e.AtLimit)
				for _, t := range e.Top {
					c, v := counterOf{t.ID, t.By}, used[counterOf{t.ID, t.By}]
					if rep.Shared {
						v[1] = max(v[1], t.Used)
					} else {
						v[0] += t.Used
					}
					used[c] = v
				}
			}
			capacity := windowCapacity(w)
			// The window's figure: the one counter's use, or the most used counter's.
			var top counterOf
			topUsed := 0.0
			for c, v := range used {
				if s := v[0] + v[1]; s > topUsed || s == topUsed && (c.id < top.id || c.id == top.id && c.by < top.by) {
					top, topUsed = c, s
				}
			}
			wu := twv1alpha1.WindowUsage{Window: render.WindowText(g.Amount, w, w.Limit), Refused: refused}
			pu := periodUsage(topUsed, capacity)
			if pu == nil {
				continue // no allowance: nothing to show
			}
			if !single {
				wu.SubjectsAtLimit = ptr.To(int32(min(atLimit, math.MaxInt32))) //nolint:gosec // bounded just above
				mostAt = max(mostAt, *wu.SubjectsAtLimit)
			}
			// A budget of another namespace with a counter per subject that governs
			// other tenants' subjects too shows neither their names nor their levels.
			if single || !hide {
				wu.UsedPercent = ptr.To(pu.UsedPercent)
				most = max(most, pu.UsedPercent)
				if topUsed > 0 {
					wu.Used = amountText(g.Amount, topUsed)
				}
				if !single && topUsed > 0 {
					wu.TopConsumer = counterName(b, top)
				}
				if f := topUsed / capacity; f > bestFrac {
					bestFrac = f
					u.TopConsumer = wu.TopConsumer
				}
			}
			if len(u.Windows) < 16 {
				u.Windows = append(u.Windows, wu)
			}
		}
	}
	if most >= 0 {
		u.Used = fmt.Sprintf("%d%%", most)
	}
	if mostAt >= 0 {
		u.SubjectsAtLimit = ptr.To(mostAt)
	}
	return u
}

// counterName names a counter in status: its subject (an ApiKey of another namespace
// as namespace/name), and its countBy value after a comma.
func counterName(b *twv1alpha1.TokenBudget, c counterOf) string {
	name := ""
	if c.id != "" {
		name = subjectName(b.Spec.Dimension, c.id)
	}
	if c.by != "" {
		by := c.by
		if b.Spec.CountBy == twv1alpha1.CountByAPIKey {
			by = subjectName(twv1alpha1.DimensionPerAPIKey, by)
		}
		if name != "" {
			name += ", "
		}
		name += by
	}
	if len(name) > maxSubjectName {
		name = name[:maxSubjectName]
	}
	return name
}

// amountText is an amount in a window's units: "592k", "12 req", "$12.50".
func amountText(amount twv1alpha1.Amount, v float64) string {
	v = min(max(v, 0), 1e18)
	switch amount {
	case twv1alpha1.AmountCost:
		return "$" + strconv.FormatFloat(v, 'f', 2, 64)
	case twv1alpha1.AmountRequests:
		return render.Compact(math.Round(v)) + " req"
	}
	return render.Compact(math.Round(v))
}
