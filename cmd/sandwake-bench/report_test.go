package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The bench itself needs Docker and minutes; `go test` checks only its
// arithmetic and its tables.

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, c := range []struct {
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 50, 7 * time.Millisecond},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{ms(1, 2, 3, 4), 51, 3 * time.Millisecond},
		{ms(1, 2, 3, 4), 100, 4 * time.Millisecond},
		{hundred, 50, 50 * time.Millisecond},
		{hundred, 99, 99 * time.Millisecond},
		{hundred, 99.5, 100 * time.Millisecond},
		{hundred, 0.1, 1 * time.Millisecond},
	} {
		if got := percentile(c.sorted, c.p); got != c.want {
			t.Errorf("p%v of %d samples: %v, want %v", c.p, len(c.sorted), got, c.want)
		}
	}
}

func TestMeanAndSortedCopy(t *testing.T) {
	ds := []time.Duration{3, 1, 2}
	if m := mean(ds); m != 2 {
		t.Errorf("mean %v", m)
	}
	s := sortedCopy(ds)
	if s[0] != 1 || s[2] != 3 || ds[0] != 3 {
		t.Errorf("sorted %v, original %v", s, ds)
	}
	if mean(nil) != 0 {
		t.Error("mean of nothing")
	}
}

func TestRowsVerdicts(t *testing.T) {
	for _, c := range []struct {
		r       row
		ratio   float64
		goal    string
		verdict string
	}{
		{ratioRow("tput", 1000, 960, fmtRate, atLeast(0.95)), 0.96, "≥ 0.95", "PASS"},
		{ratioRow("tput", 1000, 940, fmtRate, atLeast(0.95)), 0.94, "≥ 0.95", "MISS"},
		{ratioRow("p99", 0.010, 0.011, fmtSeconds, atMost(1.10)), 1.1, "≤ 1.10", "PASS"},
		{ratioRow("p99", 0.010, 0.012, fmtSeconds, atMost(1.10)), 1.2, "≤ 1.10", "MISS"},
		{ratioRow("shown as 1.10", 0.0465, 0.0512, fmtSeconds, atMost(1.10)), 0.0512 / 0.0465, "≤ 1.10", "PASS"},
		{ratioRow("shown as 1.11", 0.0465, 0.0514, fmtSeconds, atMost(1.10)), 0.0514 / 0.0465, "≤ 1.10", "MISS"},
		{ratioRow("info", 2, 3, fmtCount, info), 1.5, "", ""},
		{ratioRow("no baseline", 0, 3, fmtCount, atMost(1)), math.NaN(), "≤ 1", "MISS"},
		{valueRow("starts", "", 1, fmtCount, exactly(1)), math.NaN(), "= 1", "PASS"},
		{valueRow("starts", "", 2, fmtCount, exactly(1)), math.NaN(), "= 1", "MISS"},
		{valueRow("fb", "", 0.049, fmtSeconds, goal{op: "<=", limit: 0.05, format: fmtSeconds}), math.NaN(), "≤ 50.0 ms", "PASS"},
	} {
		if math.IsNaN(c.ratio) != math.IsNaN(c.r.ratio) || (!math.IsNaN(c.ratio) && math.Abs(c.r.ratio-c.ratio) > 1e-9) {
			t.Errorf("%s: ratio %v, want %v", c.r.cell, c.r.ratio, c.ratio)
		}
		if c.r.goal != c.goal || c.r.verdict != c.verdict {
			t.Errorf("%s: goal %q verdict %q, want %q %q", c.r.cell, c.r.goal, c.r.verdict, c.goal, c.verdict)
		}
	}
}

func TestTableRender(t *testing.T) {
	tb := &table{title: "Hot path", note: "same Caddy"}
	tb.add(ratioRow("GET c=1 throughput", 10000, 9700, fmtRate, atLeast(0.95)))
	tb.add(ratioRow("GET c=1 p99", 0.0004, 0.0005, fmtSeconds, atMost(1.10)))
	tb.add(valueRow("starts", "", 1, fmtCount, exactly(1)))
	var b strings.Builder
	tb.render(&b)
	want := `
== Hot path
   same Caddy
cell                    baseline     sandwake  ratio  goal
------------------------------------------------------------------
GET c=1 throughput  10,000 req/s  9,700 req/s   0.97  ≥ 0.95  PASS
GET c=1 p99             0.400 ms     0.500 ms   1.25  ≤ 1.10  MISS
starts                         —            1      —  = 1     PASS
`
	if b.String() != want {
		t.Errorf("render:\n%s\nwant:\n%s", b.String(), want)
	}
	if tb.misses() != 1 {
		t.Errorf("misses %d", tb.misses())
	}
	b.Reset()
	tb.markdown(&b)
	if !strings.Contains(b.String(), "| GET c=1 p99 | 1.25 | ≤ 1.10 | MISS | 0.400 ms | 0.500 ms |") {
		t.Errorf("markdown:\n%s", b.String())
	}

	tb = &table{title: "Cluster", sides: [2]string{"direct", "forwarded"}}
	tb.add(ratioRow("GET c=1 p50", 0.001, 0.0015, fmtSeconds, info))
	b.Reset()
	tb.render(&b)
	if !strings.Contains(b.String(), "cell          direct  forwarded  ratio  goal\n") {
		t.Errorf("render with side names:\n%s", b.String())
	}
	b.Reset()
	tb.markdown(&b)
	if !strings.Contains(b.String(), "| cell | ratio | goal | | direct | forwarded |") {
		t.Errorf("markdown with side names:\n%s", b.String())
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{fmtDuration(183 * time.Microsecond), "0.183 ms"},
		{fmtDuration(2500 * time.Microsecond), "2.50 ms"},
		{fmtDuration(25 * time.Millisecond), "25.0 ms"},
		{fmtDuration(475 * time.Millisecond), "475 ms"},
		{fmtDuration(12 * time.Second), "12.0 s"},
		{fmtRate(1234567.4), "1,234,567 req/s"},
		{fmtCount(999), "999"},
		{groupThousands(-1000), "-1,000"},
		{fmtNanos(511), "511 ns"},
		{fmtNanos(12345), "12.3 µs"},
		{fmtBytes(3.4 * 1024), "3.4 KiB"},
		{fmtBytes(61.1 * 1024 * 1024), "61.1 MiB"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestFlags(t *testing.T) {
	o, err := parseFlags([]string{"--quick", "--only", "wake,storm"})
	if err != nil {
		t.Fatal(err)
	}
	if o.perSide != time.Second || o.wakes != 6 || o.containers != 20 || o.burst != 5 || o.stormRounds != 1 {
		t.Errorf("quick defaults: %+v", o)
	}
	if !o.runs("wake") || o.runs("hotpath") {
		t.Errorf("--only: %+v", o)
	}
	o, _ = parseFlags([]string{"--skip-containers"})
	if o.runs("containers") || !o.runs("records") || !o.runs("cluster") || o.runs("soak") || o.perSide != 3*time.Second || o.containers != 100 {
		t.Errorf("full defaults: %+v", o)
	}
	o, _ = parseFlags([]string{"--only", "cluster"})
	if !o.runs("cluster") || o.runs("hotpath") {
		t.Errorf("--only cluster: %+v", o)
	}
	if _, err := parseFlags([]string{"--only", "nosuch"}); err == nil {
		t.Error("unknown scenario accepted")
	}
	if _, err := parseFlags([]string{"--containers", "5", "--burst", "6"}); err == nil {
		t.Error("burst beyond containers accepted")
	}
}

func TestParseStatCPU(t *testing.T) {
	// comm with a space and a parenthesis; utime 250, stime 50 ticks.
	stat := "4242 (cad dy) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 50 0 0 20 0 9 0 100 1000000 500 18446744073709551615"
	d, err := parseStatCPU(stat)
	if err != nil || d != 3*time.Second {
		t.Fatalf("parseStatCPU: %v, %v", d, err)
	}
	if _, err := parseStatCPU("garbage"); err == nil {
		t.Error("garbage parsed")
	}
}

func TestWithDefaults(t *testing.T) {
	tests := []struct{ extra, want string }{
		{"", "idle_pause 0\n\t\tidle_stop 0\n\t\tstop_timeout 2s\n\t\t"},
		{"max_resident 8\n\t\tidle_pause 2s\n\t\tidle_stop 6s", "stop_timeout 2s\n\t\tmax_resident 8\n\t\tidle_pause 2s\n\t\tidle_stop 6s"},
	}
	for _, tt := range tests {
		if got := withDefaults(tt.extra); got != tt.want {
			t.Errorf("withDefaults(%q) = %q, want %q", tt.extra, got, tt.want)
		}
	}
}
