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

// reapConfig has idle tiers and an expiry none of the seeded records is due
// for.
func reapConfig(n int) lifecycle.Config {
	return lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute, MaxLifetime: 24 * time.Hour, MaxResident: n,
		Now: func() time.Time { return testClock.Add(time.Minute) }}
}

// plainConfig has the defaults.
func plainConfig(int) lifecycle.Config {
	return lifecycle.Config{Now: func() time.Time { return testClock.Add(time.Minute) }}
}

// benchOver runs, for each of benchSizes, pass over a store of n seeded
// records, timing it and reporting ns/record. pass gets the store's
// environment and a Manager that read the records as one started over them
// would.
func benchOver(b *testing.B, config func(n int) lifecycle.Config, pass func(ctx context.Context, e *testEnv, m *lifecycle.Manager, n int) error) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			e := newTestEnvWith(b, config(n), nil)
			seedRecords(b, e, n)
			m, err := lifecycle.NewManager(e.st, e.rt, config(n))
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				if err := pass(ctx, e, m, n); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n)/float64(b.N), "ns/record")
		})
	}
}

// reapChecked is nil when a reaper pass read want records and did nothing.
func reapChecked(stats lifecycle.ReapStats, err error, want int) error {
	if err != nil || stats.Scanned != want || stats.Total() != 0 || stats.Errors != 0 {
		return fmt.Errorf("reap pass: %+v, %v; want %d records read, nothing done", stats, err, want)
	}
	return nil
}

// reconcileChecked is nil when a reconcile counted n records and corrected
// nothing.
func reconcileChecked(stats lifecycle.ReconcileStats, err error, n int) error {
	if err != nil || stats.Records != n || len(stats.Corrections) != 0 || len(stats.Orphans) != 0 {
		return fmt.Errorf("reconcile: records %d, corrections %v, orphans %d, %v", stats.Records, stats.Corrections, len(stats.Orphans), err)
	}
	return nil
}

// BenchmarkReapPass is one reaper pass (idle tiers, expiry, pressure) over n
// records of which none is due: the steady-state cost of the reaper loop.
func BenchmarkReapPass(b *testing.B) {
	benchOver(b, reapConfig, func(ctx context.Context, _ *testEnv, m *lifecycle.Manager, n int) error {
		stats, err := m.ReapOnce(ctx)
		return reapChecked(stats, err, n)
	})
}

// BenchmarkReapResidentPass is the reaper loop's pass between full ones:
// over the running and paused sandboxes alone (a quarter of the seeded
// records here; in a real farm the few hundred max_resident allows).
func BenchmarkReapResidentPass(b *testing.B) {
	benchOver(b, reapConfig, func(ctx context.Context, _ *testEnv, m *lifecycle.Manager, n int) error {
		stats, err := m.ReapResidentOnce(ctx)
		return reapChecked(stats, err, n/4)
	})
}

// BenchmarkBootReconcile is what a start over n records costs before the
// gateway serves: loading the records (NewManager) and one full reconcile
// against the engine's container list.
func BenchmarkBootReconcile(b *testing.B) {
	benchOver(b, plainConfig, func(ctx context.Context, e *testEnv, _ *lifecycle.Manager, n int) error {
		m, err := lifecycle.NewManager(e.st, e.rt, plainConfig(n))
		if err != nil {
			return err
		}
		defer m.Close()
		stats, err := m.Reconcile(ctx)
		return reconcileChecked(stats, err, n)
	})
}

// BenchmarkReconcilePass is the periodic reconcile (every
// reconcile_interval) over n records whose containers all agree with them:
// the steady-state cost of the reconcile loop.
func BenchmarkReconcilePass(b *testing.B) {
	benchOver(b, plainConfig, func(ctx context.Context, _ *testEnv, m *lifecycle.Manager, n int) error {
		stats, err := m.Reconcile(ctx)
		return reconcileChecked(stats, err, n)
	})
}
