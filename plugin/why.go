// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/tokenwarden/tokenwarden/proxy/accesslog"
)

// whyOptions are the flags of `why`.
type whyOptions struct {
	*Options
	out      *outputFlags
	replicas replicaFlags
}

func newWhyCommand(o *Options) *cobra.Command {
	w := &whyOptions{Options: o, out: newOutputFlags()}
	cmd := &cobra.Command{
		Use:   "why KEY",
		Short: "A key's recent refusals, newest first, from every replica's refusal audit",
		Long: `why reads the refusal audit of every replica of the fleet (GET /admin/refusals?api_key=KEY on
each replica's admin port) and merges it, newest first: when, the route and model, the budget or rule
that refused and its window, what the request asked of it, what was left where the budget is the key's
own (a shared budget's level is never told), and the Retry-After the client got.

It port-forwards to each running pod of the fleet with your kubeconfig (pods/portforward in the
namespace, so RBAC decides), and presents your kubeconfig's bearer token to the replicas' admin
authentication (a ClusterRole such as tokenwarden-proxy-admin-reader decides). --admin-addr asks
replicas at addresses you give instead; --admin-token presents another bearer token. A caller who may
not read the whole audit is shown the refusals of the keys of the tenant namespaces where it may get
tokenbudgets (the platform's own keys with the fleet's namespace).

KEY is the key's name in the fleet's config: an ApiKey's name in the fleet's namespace
(NAMESPACE_NAME for an ApiKey of another namespace).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return w.run(cmd.Context(), args[0])
		},
	}
	w.out.addFlags(cmd)
	w.replicas.addFlags(cmd)
	return cmd
}

// Refusal is one refusal as why prints it: a replica's audit entry.
type Refusal struct {
	// Replica is the pod (or the address) whose audit holds it.
	Replica string `json:"replica"`
	accesslog.AuditedRefusal
}

func (w *whyOptions) run(ctx context.Context, key string) error {
	ns, err := w.namespace()
	if err != nil {
		return err
	}
	a, err := w.connect(ctx, &w.replicas, ns)
	if err != nil {
		return err
	}
	defer a.Close()
	var rows []Refusal
	var failed []error
	for _, r := range a.replica {
		var body struct {
			APIKeys []accesslog.KeyRefusals `json:"api_keys"`
		}
		if err := a.get(ctx, r, "/admin/refusals", url.Values{"api_key": {key}}, &body); err != nil {
			if refusedErr(err) {
				return err
			}
			failed = append(failed, err)
			continue
		}
		for _, k := range body.APIKeys {
			for _, e := range k.Refusals {
				rows = append(rows, Refusal{Replica: r.name, AuditedRefusal: e})
			}
		}
	}
	if len(failed) == len(a.replica) {
		return failed[0]
	}
	for _, err := range failed {
		fmt.Fprintf(w.Streams.ErrOut, "warning: %v\n", err)
	}
	slices.SortStableFunc(rows, func(x, y Refusal) int { return y.Time.Compare(x.Time) })
	if !w.out.table() {
		return w.out.printRows(w.Streams.Out, rows)
	}
	if len(rows) == 0 && a.scoped {
		_, err := fmt.Fprintf(w.Streams.Out, "No refusal of key %q that you may read in the audit of %s: you read the keys of the namespaces where you may get tokenbudgets.\n",
			key, replicas(int32(len(a.replica)-len(failed))))
		return err
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintf(w.Streams.Out, "No refusal of key %q in the audit of %s.\n", key, replicas(int32(len(a.replica)-len(failed))))
		return err
	}
	return w.printTable(w.Streams.Out, rows)
}

// printTable prints the refusals, newest first.
func (w *whyOptions) printTable(out io.Writer, rows []Refusal) error {
	header := []string{"TIME", "ROUTE", "MODEL", "REFUSED BY", "WINDOW", "ASKED", "LEFT", "RETRY AFTER"}
	if w.out.wide() {
		header = append(header, "RESERVED", "REQUEST ID", "MESSAGE", "REPLICA")
	}
	var cells [][]string
	for _, r := range rows {
		row := []string{r.Time.UTC().Format(time.RFC3339), r.Route, dash(r.Model), refusedBy(&r.AuditedRefusal), dash(refusalWindow(&r.AuditedRefusal)),
			number(r.Asked), left(&r.AuditedRefusal), retryAfter(&r.AuditedRefusal)}
		if w.out.wide() {
			row = append(row, strconv.FormatInt(r.TokensReserved, 10), r.RequestID, r.Message, r.Replica)
		}
		cells = append(cells, row)
	}
	return printTable(out, header, cells)
}

// refusedBy names what refused: the key's own rule by name, another rule by its
// dimension (its name is not told), a dimension's limits, or the queue.
func refusedBy(r *accesslog.AuditedRefusal) string {
	switch r.Limit {
	case "rule":
		if r.Rule != "" {
			return "rule " + r.Rule
		}
		return "a " + r.Dimension + " rule"
	case "requests":
		return r.Dimension + " requests"
	case "token_budget":
		return r.Dimension + " tokens"
	}
	return dash(r.Limit)
}

// refusalWindow is the refusing window: a rule's, or a limit's period.
func refusalWindow(r *accesslog.AuditedRefusal) string {
	switch {
	case r.Window != "":
		return r.Window
	case r.Limit == "requests":
		return "second"
	}
	return strings.TrimPrefix(r.Period, "tokens_")
}

// left is what was left of the key's own budget, of its capacity; "-" for a shared one.
func left(r *accesslog.AuditedRefusal) string {
	if r.Remaining == nil || r.Capacity == nil {
		return "-"
	}
	return number(math.Floor(*r.Remaining)) + "/" + number(*r.Capacity)
}

// retryAfter is the Retry-After the client got, and when no wait lets it in.
func retryAfter(r *accesslog.AuditedRefusal) string {
	if r.RetryAfterSeconds <= 0 {
		return "-"
	}
	s := duration.HumanDuration(time.Duration(r.RetryAfterSeconds) * time.Second)
	if r.LargerThanBudget {
		s += " (larger than the budget)"
	}
	return s
}

// number prints an amount: whole numbers as such, others with up to four decimals.
func number(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.FormatInt(int64(f), 10)
	}
	return strings.TrimRight(strings.TrimRight(strconv.FormatFloat(f, 'f', 4, 64), "0"), ".")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
