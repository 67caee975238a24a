// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"fmt"
	"html"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Series are a run's per-second series for the chart.
type Series struct {
	// Seconds is the number of one-second bins.
	Seconds int
	// Sequences is, per tenant, the mean sequences the backend ran in each second;
	// Context the mean KV cache tokens they held.
	Sequences map[string][]float64
	Context   map[string][]float64
	// Queue is the requests sent and neither started nor refused, at each second.
	Queue []float64
	// Refused is the 429s in each second.
	Refused []int
}

// Series bins the run by world second.
func (r *Result) Series() Series {
	n := int(r.End.Seconds()) + 1
	s := Series{Seconds: n, Sequences: map[string][]float64{}, Context: map[string][]float64{}, Queue: make([]float64, n), Refused: make([]int, n)}
	for _, t := range r.World.Tenants {
		s.Sequences[t.Name] = make([]float64, n)
		s.Context[t.Name] = make([]float64, n)
	}
	for _, st := range r.Steps {
		b := int(st.Start.Seconds())
		if b < 0 || b >= n {
			continue
		}
		d := (st.End - st.Start).Seconds()
		for tenant, k := range st.Sequences {
			if seq := s.Sequences[tenant]; seq != nil {
				seq[b] += float64(k) * d
			}
		}
		for tenant, k := range st.Context {
			if c := s.Context[tenant]; c != nil {
				c[b] += float64(k) * d
			}
		}
	}
	for _, rec := range r.Records {
		if rec.Status == http.StatusTooManyRequests {
			if b := int(rec.Sent.Seconds()); b < n {
				s.Refused[b]++
			}
			continue
		}
		end := rec.Started
		if end < 0 {
			end = r.End
		}
		for b := int(rec.Sent.Seconds()) + 1; b < n && time.Duration(b)*time.Second < end; b++ {
			s.Queue[b]++
		}
	}
	return s
}

var palette = []string{"#4e79a7", "#76b7b2", "#59a14f", "#8cd17d", "#f28e2b", "#b07aa1", "#9c755f", "#bab0ac"}

// SVG draws a run: the backend's work (the KV cache its sequences hold, the resource
// the lab's backend runs out of) stacked by tenant, its capacity as a dashed line, the
// requests waiting to start (proxy and backend queues, right axis) as a red line, and
// the 429s as labels.
func (r *Result) SVG() string {
	const W, H, left, right, top, bottom = 980.0, 360.0, 50.0, 220.0, 30.0, 40.0
	s := r.Series()
	capK := float64(int64(r.World.Backend.Replicas)*r.World.Backend.KVTokens) / 1000
	if capK <= 0 {
		capK = float64(r.World.Slots())
	}
	ymax := capK * 1.25
	qmax := 10.0
	for _, q := range s.Queue {
		qmax = max(qmax, q*1.05)
	}
	qstep := niceStep(qmax)
	qmax = qstep * math.Ceil(qmax/qstep)
	pw, ph := W-left-right, H-top-bottom
	x := func(sec float64) float64 { return left + pw*sec/float64(max(1, s.Seconds-1)) }
	y := func(v float64) float64 { return top + ph*(1-v/ymax) }
	yq := func(v float64) float64 { return top + ph*(1-v/qmax) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`, W, H)
	fmt.Fprintf(&b, `<text x="%.0f" y="16" font-size="13" font-weight="bold">%s</text>`, left, html.EscapeString(r.Policy.Name))
	// Stacked areas, first tenant at the bottom.
	base := make([]float64, s.Seconds)
	for i, t := range r.World.Tenants {
		seq := s.Context[t.Name]
		if r.World.Backend.KVTokens <= 0 {
			seq = s.Sequences[t.Name]
		}
		for k := range seq {
			if r.World.Backend.KVTokens > 0 {
				seq[k] /= 1000
			}
		}
		var pts []string
		for k := range s.Seconds {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(k)), y(base[k]+seq[k])))
		}
		for k := s.Seconds - 1; k >= 0; k-- {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(k)), y(base[k])))
		}
		for k := range base {
			base[k] += seq[k]
		}
		c := palette[i%len(palette)]
		fmt.Fprintf(&b, `<polygon points="%s" fill="%s" fill-opacity="0.85" stroke="none"><title>%s</title></polygon>`, strings.Join(pts, " "), c, html.EscapeString(t.Name))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="10" height="10" fill="%s"/><text x="%.0f" y="%.0f">%s (%s)</text>`,
			W-right+40, top+float64(i)*16, c, W-right+54, top+float64(i)*16+9, html.EscapeString(t.Name), t.Class)
	}
	// Capacity and queue.
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#333" stroke-dasharray="6,4"/>`, left, left+pw, y(capK), y(capK))
	fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" fill="#333">capacity %.0fk tokens</text>`, left+4, y(capK)-4, capK)
	var q []string
	for k, v := range s.Queue {
		q = append(q, fmt.Sprintf("%.1f,%.1f", x(float64(k)), yq(v)))
	}
	fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="#d62728" stroke-width="2"/>`, strings.Join(q, " "))
	n := len(r.World.Tenants)
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#d62728" stroke-width="2"/><text x="%.0f" y="%.0f">waiting (right axis)</text>`,
		W-right+40, W-right+50, top+float64(n)*16+5, top+float64(n)*16+5, W-right+54, top+float64(n)*16+9)
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#333" stroke-dasharray="6,4"/><text x="%.0f" y="%.0f">backend capacity</text>`,
		W-right+40, W-right+50, top+float64(n+1)*16+5, top+float64(n+1)*16+5, W-right+54, top+float64(n+1)*16+9)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="#d62728" font-weight="bold">429</text><text x="%.0f" y="%.0f">refused, per 5 s</text>`,
		W-right+40, top+float64(n+2)*16+9, W-right+66, top+float64(n+2)*16+9)
	// 429 labels, summed over five seconds.
	for k := 0; k < s.Seconds; k += 5 {
		c := 0
		for j := k; j < min(k+5, s.Seconds); j++ {
			c += s.Refused[j]
		}
		if c > 0 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" fill="#d62728" font-size="10" text-anchor="middle">429×%d</text>`, x(float64(k)+2.5), top+10+float64((k/5)%3)*11, c)
		}
	}
	// Axes.
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#000"/><line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#000"/>`,
		left, left+pw, top+ph, top+ph, left, left, top, top+ph)
	for sec := 0; sec < s.Seconds; sec += 20 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%ds</text>`, x(float64(sec)), top+ph+14, sec)
	}
	step := niceStep(ymax)
	for v := 0.0; v <= ymax; v += step {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%.0f</text>`, left-4, y(v)+4, v)
	}
	for v := 0.0; v <= qmax; v += qstep {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" fill="#d62728">%.0f</text>`, left+pw+4, yq(v)+4, v)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">world time; left: thousands of KV cache tokens the backend's sequences hold, stacked by tenant; right: requests waiting to start</text>`, left+pw/2, H-6)
	b.WriteString(`</svg>`)
	return b.String()
}

func niceStep(v float64) float64 {
	for _, s := range []float64{10, 20, 50, 100, 200, 500, 1000, 2000, 5000} {
		if v/s <= 8 {
			return s
		}
	}
	return 10000
}

const page = `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>%s</title>
<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}.ok{color:#2a7}.fail{color:#c22;font-weight:bold}pre{font-size:12px}</style>
</head><body>
%s
</body></html>
`

// HTMLTable writes the missions' outcomes as HTML tables.
func HTMLTable(outcomes []*Outcome, link func(*Result) string) string {
	var b strings.Builder
	for _, o := range outcomes {
		verdict := `<span class="ok">met</span>`
		if !o.OK() {
			verdict = `<span class="fail">missed</span>`
		}
		fmt.Fprintf(&b, "<h2>%s: %s</h2><p>%s</p>\n", html.EscapeString(o.Mission), verdict, html.EscapeString(o.Question))
		b.WriteString("<table><tr><th>run</th><th>chat within target</th><th>chat p95 wait</th><th>chat refused</th><th>batch output tok/s</th><th>agent tok/s</th><th>backend busy</th><th>429s</th></tr>\n")
		for _, r := range o.Runs {
			s := r.Summarize()
			name := html.EscapeString(s.Name)
			if link != nil {
				name = fmt.Sprintf(`<a href="%s">%s</a>`, link(r), name)
			}
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%.1f%%</td><td>%.1f s</td><td>%d of %d</td><td>%.0f</td><td>%.0f</td><td>%.0f%%</td><td>%d</td></tr>\n",
				name, 100*s.ChatWithinTarget, s.ChatWaitP95.Seconds(), s.ChatRefused, s.ChatRequests, s.BatchOutputPerSecond,
				s.AgentTokensPerSecond, 100*s.Utilization, total(s.Refused))
		}
		b.WriteString("</table>\n<table><tr><th>target</th><th>got</th><th></th></tr>\n")
		for _, c := range o.Checks {
			mark := `<span class="ok">ok</span>`
			if !c.OK {
				mark = `<span class="fail">missed</span>`
			}
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%s</td></tr>\n", html.EscapeString(c.Target), html.EscapeString(c.Got), mark)
		}
		b.WriteString("</table>\n")
	}
	return b.String()
}

var unsafeName = regexp.MustCompile(`[^a-z0-9]+`)

// Write writes, under dir, a self-contained HTML page per run (its chart and figures),
// index.html (the mission table and every chart) and missions.txt (the table as
// text), and returns the files written.
func Write(dir string, w *World, outcomes []*Outcome) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	names := map[*Result]string{}
	var charts strings.Builder
	for _, o := range outcomes {
		for _, r := range o.Runs {
			if _, done := names[r]; done {
				continue
			}
			name := fmt.Sprintf("run-%02d-%s.html", len(names)+1, strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(r.Policy.Name), "-"), "-"))
			names[r] = name
			svg := r.SVG()
			fmt.Fprintf(&charts, "<h3>%s</h3>\n%s\n", html.EscapeString(r.Policy.Name), svg)
			body := fmt.Sprintf("<h1>%s</h1>\n%s\n<pre>%s</pre>\n<h3>The proxy's config</h3><pre>%s</pre>", html.EscapeString(r.Policy.Name), svg,
				html.EscapeString(r.Summarize().String()), html.EscapeString(w.Document(r.Policy, "http://backend")))
			f := filepath.Join(dir, name)
			if err := os.WriteFile(f, []byte(fmt.Sprintf(page, html.EscapeString(r.Policy.Name), body)), 0o644); err != nil {
				return nil, err
			}
			files = append(files, f)
		}
	}
	text := Table(outcomes)
	index := fmt.Sprintf("<h1>The token rate limiting lab</h1>\n<p>Four chat apps, a batch job and a runaway agent through the real proxy: %d replicas × %d sequences, step time %g ms + %g ms per token, %g s of world per run at %g× speed.</p>\n%s\n<h2>Charts</h2>\n%s\n<h2>The table as text</h2><pre>%s</pre>",
		w.Backend.Replicas, w.Backend.MaxBatch, w.Backend.StepBaseMillis, w.Backend.StepPerTokenMillis, w.DurationSeconds, w.TimeScale,
		HTMLTable(outcomes, func(r *Result) string { return names[r] }), charts.String(), html.EscapeString(text))
	f := filepath.Join(dir, "index.html")
	if err := os.WriteFile(f, []byte(fmt.Sprintf(page, "The token rate limiting lab", index)), 0o644); err != nil {
		return nil, err
	}
	files = append(files, f)
	f = filepath.Join(dir, "missions.txt")
	if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
		return nil, err
	}
	return append(files, f), nil
}
