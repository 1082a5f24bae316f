package lifecycle_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// benchSizes are the record counts the scale benchmarks run at; the design's
// target is 10,000 sandboxes on one host, the next 100,000 (issue 21).
var benchSizes = []int{1000, 10000, 100000}

// benchStates cycles through the states a large farm mostly holds.
var benchStates = []lifecycle.State{lifecycle.Running, lifecycle.Paused, lifecycle.Stopped, lifecycle.Stopped, lifecycle.Stopped, lifecycle.Stopped, lifecycle.Killed, lifecycle.Expired}

// seedRecords stores n records directly (no manager, no admission) and gives
// the fake engine the containers that match them, so that neither a reaper
// pass nor a reconcile has anything to correct.
func seedRecords(b *testing.B, e *testEnv, n int) {
	b.Helper()
	spec := testSpec()
	if err := lifecycle.NormalizeSpec(&spec); err != nil {
		b.Fatal(err)
	}
	up := map[int]string{testPort: e.srv.Listener.Addr().String()}
	for i := range n {
		id := fmt.Sprintf("sb%05d", i)
		s := benchStates[i%len(benchStates)]
		rec := lifecycle.Record{ID: id, Spec: spec, State: s, CreatedAt: testClock, LastActiveAt: testClock, StateSince: testClock}
		if lifecycle.Resident(s) {
			rec.ContainerID = "seeded-" + id
			rec.Upstreams = up
		}
		if _, _, err := e.st.Create(rec, "seed"); err != nil {
			b.Fatal(err)
		}
		e.rt.Put(id, containerFor(s))
	}
}

// BenchmarkReapPass is one reaper pass (idle tiers, expiry, pressure) over n
// records of which none is due: the steady-state cost of the reaper loop.
func BenchmarkReapPass(b *testing.B) {
	benchReap(b, (*lifecycle.Manager).ReapOnce, func(n int) int { return n })
}

// BenchmarkReapResidentPass is the reaper loop's pass between full ones:
// over the running and paused sandboxes alone (a quarter of the seeded
// records here; in a real farm the few hundred max_resident allows).
func BenchmarkReapResidentPass(b *testing.B) {
	benchReap(b, (*lifecycle.Manager).ReapResidentOnce, func(n int) int { return n / 4 })
}

// benchReap times pass over each of benchSizes records, none due, checking
// that it read scanned(n) of them.
func benchReap(b *testing.B, pass func(*lifecycle.Manager, context.Context) (lifecycle.ReapStats, error), scanned func(n int) int) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			cfg := lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute, MaxLifetime: 24 * time.Hour, MaxResident: n,
				Now: func() time.Time { return testClock.Add(time.Minute) }}
			e := newTestEnvWith(b, cfg, nil)
			seedRecords(b, e, n)
			// A new manager reads the records, as one started over them would.
			m, err := lifecycle.NewManager(e.st, e.rt, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				stats, err := pass(m, ctx)
				if err != nil || stats.Scanned != scanned(n) || stats.Total() != 0 || stats.Errors != 0 {
					b.Fatalf("reap pass: %+v, %v", stats, err)
				}
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n)/float64(b.N), "ns/record")
		})
	}
}

// BenchmarkBootReconcile is what a start over n records costs before the
// gateway serves: loading the records (NewManager) and one full reconcile
// against the engine's container list.
func BenchmarkBootReconcile(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			cfg := lifecycle.Config{Now: func() time.Time { return testClock.Add(time.Minute) }}
			e := newTestEnvWith(b, cfg, nil)
			seedRecords(b, e, n)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				m, err := lifecycle.NewManager(e.st, e.rt, cfg)
				if err != nil {
					b.Fatal(err)
				}
				stats, err := m.Reconcile(ctx)
				if err != nil || stats.Records != n || len(stats.Corrections) != 0 || len(stats.Orphans) != 0 {
					b.Fatalf("reconcile: records %d, corrections %v, orphans %d, %v", stats.Records, stats.Corrections, len(stats.Orphans), err)
				}
				m.Close()
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n)/float64(b.N), "ns/record")
		})
	}
}

// BenchmarkReconcilePass is the periodic reconcile (every
// reconcile_interval) over n records whose containers all agree with them:
// the steady-state cost of the reconcile loop.
func BenchmarkReconcilePass(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			cfg := lifecycle.Config{Now: func() time.Time { return testClock.Add(time.Minute) }}
			e := newTestEnvWith(b, cfg, nil)
			seedRecords(b, e, n)
			m, err := lifecycle.NewManager(e.st, e.rt, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				stats, err := m.Reconcile(ctx)
				if err != nil || stats.Records != n || len(stats.Corrections) != 0 || len(stats.Orphans) != 0 {
					b.Fatalf("reconcile: records %d, corrections %v, orphans %d, %v", stats.Records, stats.Corrections, len(stats.Orphans), err)
				}
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n)/float64(b.N), "ns/record")
		})
	}
}
