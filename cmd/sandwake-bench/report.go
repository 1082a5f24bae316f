package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// percentile returns the p-th percentile (0 < p ≤ 100) of sorted by the
// nearest-rank method: the smallest value at least p% of the samples are at
// or below. It returns 0 for no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// mean returns the arithmetic mean of ds, 0 for none.
func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// sortedCopy returns ds sorted, leaving ds as it was.
func sortedCopy(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s
}

// goal is what a ratio (sandwake / baseline) or a value must meet.
type goal struct {
	op     string // ">=", "<=", "==" or "" (no goal: information only)
	limit  float64
	format func(float64) string // how limit is shown; nil: a plain number
}

func atLeast(x float64) goal { return goal{op: ">=", limit: x} }
func atMost(x float64) goal  { return goal{op: "<=", limit: x} }
func exactly(x float64) goal { return goal{op: "==", limit: x} }

// info is no goal: the row is information.
var info = goal{}

func (g goal) String() string {
	f := trimFloat
	if g.format != nil {
		f = g.format
	}
	switch g.op {
	case ">=":
		return "≥ " + f(g.limit)
	case "<=":
		return "≤ " + f(g.limit)
	case "==":
		return "= " + f(g.limit)
	}
	return ""
}

func (g goal) met(v float64) bool {
	switch g.op {
	case ">=":
		return v >= g.limit
	case "<=":
		return v <= g.limit
	case "==":
		return v == g.limit
	}
	return true
}

// trimFloat shows a whole number without decimals, others with two.
func trimFloat(f float64) string {
	if f == math.Trunc(f) {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%.2f", f)
}

// row is one line of a result table.
type row struct {
	cell               string
	baseline, sandwake string
	ratio              float64 // NaN: no ratio
	goal               string
	verdict            string // PASS, MISS or "" (information only)
}

// ratioRow compares sandwake with its baseline: the ratio is sandwake /
// baseline and g applies to it.
func ratioRow(cell string, base, sw float64, format func(float64) string, g goal) row {
	r := row{cell: cell, baseline: format(base), sandwake: format(sw), ratio: math.NaN(), goal: g.String()}
	if base > 0 {
		r.ratio = sw / base
	}
	if g.op != "" {
		// Judged as shown: rounded to two decimals, as the goals are written.
		r.verdict = verdict(!math.IsNaN(r.ratio) && g.met(math.Round(r.ratio*100)/100))
	}
	return r
}

// valueRow reports a sandwake value checked against an absolute goal (or
// none); baseline may be empty.
func valueRow(cell, baseline string, value float64, format func(float64) string, g goal) row {
	r := row{cell: cell, baseline: baseline, sandwake: format(value), ratio: math.NaN(), goal: g.String()}
	if g.op != "" {
		r.verdict = verdict(g.met(value))
	}
	return r
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// table is one scenario's results.
type table struct {
	title string
	note  string    // one line under the title: what was compared, how
	sides [2]string // headers of the two value columns; "": baseline, sandwake
	rows  []row
}

func (t *table) add(r row) { t.rows = append(t.rows, r) }

// misses counts the rows that missed their goal.
func (t *table) misses() int {
	n := 0
	for _, r := range t.rows {
		if r.verdict == "MISS" {
			n++
		}
	}
	return n
}

// header is the table's header line.
func (t *table) header() [6]string {
	h := [6]string{"cell", "baseline", "sandwake", "ratio", "goal", ""}
	for i, s := range t.sides {
		if s != "" {
			h[1+i] = s
		}
	}
	return h
}

func (r row) fields() [6]string {
	ratio := "—"
	if !math.IsNaN(r.ratio) {
		ratio = fmt.Sprintf("%.2f", r.ratio)
	}
	base := r.baseline
	if base == "" {
		base = "—"
	}
	g := r.goal
	if g == "" {
		g = "—"
	}
	return [6]string{r.cell, base, r.sandwake, ratio, g, r.verdict}
}

// render writes the table as aligned text.
func (t *table) render(w io.Writer) {
	fmt.Fprintf(w, "\n== %s\n", t.title)
	if t.note != "" {
		fmt.Fprintf(w, "   %s\n", t.note)
	}
	lines := [][6]string{t.header()}
	for _, r := range t.rows {
		lines = append(lines, r.fields())
	}
	var width [6]int
	for _, l := range lines {
		for i, f := range l {
			width[i] = max(width[i], len([]rune(f)))
		}
	}
	for n, l := range lines {
		var b strings.Builder
		for i, f := range l {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := width[i] - len([]rune(f))
			if i >= 1 && i <= 3 { // numbers: right-aligned
				b.WriteString(strings.Repeat(" ", pad) + f)
			} else {
				b.WriteString(f + strings.Repeat(" ", pad))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
		if n == 0 {
			total := 0
			for _, x := range width {
				total += x
			}
			fmt.Fprintln(w, strings.Repeat("-", total+2*(len(width)-1)))
		}
	}
}

// markdown writes the table as a Markdown table, ratio first after the cell
// (the figure to read), absolute numbers after it.
func (t *table) markdown(w io.Writer) {
	fmt.Fprintf(w, "\n**%s**", t.title)
	if t.note != "" {
		fmt.Fprintf(w, " — %s", t.note)
	}
	h := t.header()
	fmt.Fprintf(w, "\n\n| cell | ratio | goal | | %s | %s |\n|---|---|---|---|---|---|\n", h[1], h[2])
	for _, r := range t.rows {
		f := r.fields()
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", f[0], f[3], f[4], f[5], f[1], f[2])
	}
}

// Formats of the values in the tables.

func fmtDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d < 100*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// fmtSeconds formats a duration given in seconds (as the table rows carry
// float64 values).
func fmtSeconds(s float64) string { return fmtDuration(time.Duration(s * float64(time.Second))) }

func fmtRate(r float64) string { return groupThousands(int64(math.Round(r))) + " req/s" }

func fmtCount(n float64) string { return groupThousands(int64(math.Round(n))) }

func fmtNanos(ns float64) string {
	if ns >= 10_000 {
		return fmt.Sprintf("%.1f µs", ns/1000)
	}
	return fmt.Sprintf("%.0f ns", ns)
}

func fmtBytes(b float64) string {
	switch {
	case math.Abs(b) >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case math.Abs(b) >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

// groupThousands writes n with commas between groups of three digits.
func groupThousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
