package docker_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// BenchmarkCreateFromTemplate times a create from a template to the
// sandbox's first answered request, side by side:
//
//   - cold: no idle container (pool "bypass"): create, start, readiness;
//
//   - hit: a claim of a paused pool container (record, rules, unpause);
//
//   - hit-running: a claim from a pool kept running (no engine call);
//
//   - raw-unpause: the floor, Docker's unpause of a paused container and
//     the first request, with nothing recorded;
//
//   - raw-rename: what the claim would cost had pool containers been made
//     under a pool name and renamed to the sandbox's at claim (Docker
//     rename, unpause, first request), the design not taken.
//
//     go test -run '^$' -bench CreateFromTemplate -benchtime 20x ./lifecycle/docker/
func BenchmarkCreateFromTemplate(b *testing.B) {
	instance := testenv.UniqueID("pb")
	image := testenv.TestAppImage(b)
	tmpl := webTemplate(image, 1, 64)
	running := webTemplate(image, 1, 64)
	running.Name, running.Pool.State = "warm", lifecycle.PoolRunning
	f := newFixtureWith(b, lifecycle.Config{Templates: []lifecycle.Template{tmpl, running}, PoolInterval: 50 * time.Millisecond},
		func(o *docker.Options) { o.Instance, o.SandboxNetwork = instance, "" })
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		f.m.Close()
		removeInstanceVolumes(ctx, f.cli, instance)
	})
	ctx := context.Background()
	firstByte := func(b *testing.B, rec lifecycle.Record) {
		resp, err := http.Get("http://" + rec.Upstreams[8080] + "/healthz")
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("first request: %d", resp.StatusCode)
		}
	}
	waitPool := func(b *testing.B, name string) {
		deadline := time.Now().Add(time.Minute)
		for idle(f.m, name) < 1 {
			if time.Now().After(deadline) {
				b.Fatalf("pool not refilled: %+v", f.m.Templates())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	create := func(b *testing.B, name, mode string, wantHit bool) {
		for range b.N {
			b.StopTimer()
			if wantHit {
				waitPool(b, name)
			}
			b.StartTimer()
			rec, out, err := f.m.CreatePooled(ctx, lifecycle.CreateRequest{Template: name, Pool: mode})
			if err != nil {
				b.Fatal(err)
			}
			firstByte(b, rec)
			b.StopTimer()
			if out.Hit != wantHit {
				b.Fatalf("outcome %+v", out)
			}
			if _, err := f.m.Purge(ctx, rec.ID, "bench"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.Run("cold", func(b *testing.B) { create(b, "web", lifecycle.PoolBypass, false) })
	b.Run("hit", func(b *testing.B) { create(b, "web", lifecycle.PoolRequire, true) })
	b.Run("hit-running", func(b *testing.B) { create(b, "warm", lifecycle.PoolRequire, true) })
	raw := func(b *testing.B, rename bool) {
		for range b.N {
			b.StopTimer()
			rec := f.create(lifecycle.Spec{Image: image, MemoryMB: 64})
			name := docker.ContainerName(rec.ID)
			if _, err := f.cli.ContainerPause(ctx, name, client.ContainerPauseOptions{}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if rename {
				newName := name + "x"
				if _, err := f.cli.ContainerRename(ctx, name, client.ContainerRenameOptions{NewName: newName}); err != nil {
					b.Fatal(err)
				}
				name = newName
			}
			if _, err := f.cli.ContainerUnpause(ctx, name, client.ContainerUnpauseOptions{}); err != nil {
				b.Fatal(err)
			}
			firstByte(b, rec)
			b.StopTimer()
			f.cli.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true})
			if _, err := f.m.Purge(ctx, rec.ID, "bench"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.Run("raw-unpause", func(b *testing.B) { raw(b, false) })
	b.Run("raw-rename", func(b *testing.B) { raw(b, true) })
}
