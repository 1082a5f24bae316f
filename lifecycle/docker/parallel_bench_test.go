package docker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// BenchmarkParallelWake wakes 20 stopped sandboxes at once through the
// Manager, then the same 20 with the raw Docker calls a hand-rolled loop
// makes (start, inspect for the new host port, the same readiness poll),
// interleaved, and reports the wall time of each batch and their ratio.
//
//	go test -run '^$' -bench ParallelWake -benchtime 5x ./lifecycle/docker/
func BenchmarkParallelWake(b *testing.B) {
	const n = 20
	f := newFixture(b, lifecycle.Config{})
	recs := make([]lifecycle.Record, n)
	for i := range recs {
		recs[i] = f.create(lifecycle.Spec{MemoryMB: 64})
	}
	ctx := context.Background()
	all := func(fn func(i int) error) {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { errs[i] = fn(i) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	var managed, raw time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		all(func(i int) error { _, err := f.m.Stop(ctx, recs[i].ID, "bench"); return err })
		b.StartTimer()
		t0 := time.Now()
		all(func(i int) error { _, err := f.m.Wake(ctx, recs[i].ID); return err })
		managed += time.Since(t0)

		b.StopTimer()
		all(func(i int) error {
			_, err := f.cli.ContainerStop(ctx, docker.ContainerName(recs[i].ID), client.ContainerStopOptions{})
			return err
		})
		b.StartTimer()
		t0 = time.Now()
		all(func(i int) error {
			name := docker.ContainerName(recs[i].ID)
			if _, err := f.cli.ContainerStart(ctx, name, client.ContainerStartOptions{}); err != nil {
				return err
			}
			ci, err := f.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
			if err != nil {
				return err
			}
			return lifecycle.WaitReady(ctx, upstreamOf(&ci.Container), &recs[i].Spec)
		})
		raw += time.Since(t0)
		// The Manager's records say running; the containers run again.
		b.StopTimer()
		if _, err := f.m.Reconcile(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	k := float64(b.N)
	b.ReportMetric(float64(managed.Milliseconds())/k, "sandwake-ms")
	b.ReportMetric(float64(raw.Milliseconds())/k, "raw-ms")
	b.ReportMetric(float64(managed)/float64(raw), "ratio")
	b.ReportMetric(0, "ns/op")
}
