package docker_test

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// BenchmarkWake measures a wake through the Manager against its baseline, the
// raw Docker calls a hand-rolled wake loop would make (unpause, or start +
// inspect for the new port, then the same readiness poll), on the same
// container, interleaved so that both see the same machine. It reports the
// mean of each and their ratio (goal: ≤ 1.10).
//
//	go test -run '^$' -bench Wake -benchtime 20x ./lifecycle/docker/
func BenchmarkWake(b *testing.B) {
	b.Run("from=paused", func(b *testing.B) {
		benchWake(b,
			func(f *fixture, id string) error { _, err := f.m.Pause(context.Background(), id, "bench"); return err },
			func(f *fixture, id string) error {
				_, err := f.cli.ContainerPause(context.Background(), docker.ContainerName(id), client.ContainerPauseOptions{})
				return err
			},
			func(f *fixture, rec lifecycle.Record) error {
				ctx := context.Background()
				if _, err := f.cli.ContainerUnpause(ctx, docker.ContainerName(rec.ID), client.ContainerUnpauseOptions{}); err != nil {
					return err
				}
				return lifecycle.WaitReady(ctx, rec.Upstreams[8080], &rec.Spec)
			})
	})
	b.Run("from=stopped", func(b *testing.B) {
		benchWake(b,
			func(f *fixture, id string) error { _, err := f.m.Stop(context.Background(), id, "bench"); return err },
			func(f *fixture, id string) error {
				_, err := f.cli.ContainerStop(context.Background(), docker.ContainerName(id), client.ContainerStopOptions{})
				return err
			},
			func(f *fixture, rec lifecycle.Record) error {
				ctx := context.Background()
				name := docker.ContainerName(rec.ID)
				if _, err := f.cli.ContainerStart(ctx, name, client.ContainerStartOptions{}); err != nil {
					return err
				}
				// The host port (published), or the address of a
				// container without a fixed one (direct), can change on
				// start: a correct raw loop must read it again, as the
				// Manager does.
				ci, err := f.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
				if err != nil {
					return err
				}
				addr := upstreamOf(&ci.Container)
				return lifecycle.WaitReady(ctx, addr, &rec.Spec)
			})
	})
}

func benchWake(b *testing.B,
	sleepManaged, sleepRaw func(*fixture, string) error,
	wakeRaw func(*fixture, lifecycle.Record) error,
) {
	f := newFixture(b, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{})
	var managed, raw time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := sleepManaged(f, rec.ID); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		woke, err := f.m.Wake(context.Background(), rec.ID)
		managed += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}

		if err := sleepRaw(f, rec.ID); err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		err = wakeRaw(f, woke)
		raw += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(managed.Microseconds())/n/1000, "sandwake-ms")
	b.ReportMetric(float64(raw.Microseconds())/n/1000, "raw-ms")
	b.ReportMetric(float64(managed)/float64(raw), "ratio")
	b.ReportMetric(0, "ns/op")
}
