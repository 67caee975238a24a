// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/tokenwarden/tokenwarden/proxy/adminauth"
)

// forbiddenTenant is a report filtered by a tenant the caller may not read.
type forbiddenTenant struct{ tenant string }

func (e *forbiddenTenant) Error() string {
	if e.tenant == "" {
		return "you may not read the platform's own spend: it takes reading tokenbudgets in the fleet's namespace"
	}
	return fmt.Sprintf("you may not read tenant %q's spend: it takes reading tokenbudgets in namespace %q", e.tenant, e.tenant)
}

// report runs q for the caller. A caller scoped to some tenants (adminauth.ScopeOf)
// gets the rows of those tenants only, the platform's own (no tenant) with the
// fleet's namespace: one query grouped by tenant too, whose rows it may not read are
// dropped before the tenant is summed away again.
func (h *ReportHandler) report(ctx context.Context, q Query) ([]ReportRow, error) {
	sc := adminauth.ScopeOf(ctx)
	if sc.All() {
		return h.Sink.Report(ctx, q)
	}
	if t, ok := q.Where[Tenant]; ok {
		if !sc.Tenant(ctx, t) {
			return nil, &forbiddenTenant{tenant: t}
		}
		return h.Sink.Report(ctx, q)
	}
	grouped := slices.Contains(q.GroupBy, Tenant)
	wide := q
	if !grouped {
		wide.GroupBy = append([]Dimension{Tenant}, q.GroupBy...)
	}
	rows, err := h.Sink.Report(ctx, wide)
	if err != nil {
		return nil, err
	}
	rows = slices.DeleteFunc(rows, func(r ReportRow) bool { return !sc.Tenant(ctx, r.Group[Tenant]) })
	if grouped {
		return rows, nil
	}
	return foldTenant(q, rows), nil
}

// foldTenant sums rows that differ only by tenant into q's groups, in the order a
// report's rows have.
func foldTenant(q Query, rows []ReportRow) []ReportRow {
	idx := map[string]int{}
	var out []ReportRow
	for _, r := range rows {
		delete(r.Group, Tenant)
		parts := []string{r.Start.String()}
		for _, d := range q.GroupBy {
			parts = append(parts, r.Group[d])
		}
		k := strings.Join(parts, "\x00")
		if i, ok := idx[k]; ok {
			out[i].add(&r.Sums)
			continue
		}
		idx[k] = len(out)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b ReportRow) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		for _, d := range q.GroupBy {
			if c := cmp.Compare(a.Group[d], b.Group[d]); c != 0 {
				return c
			}
		}
		return 0
	})
	return out
}
