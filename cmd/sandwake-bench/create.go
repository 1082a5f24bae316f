package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

// createConfig are the create scenario's templates: one whose pool keeps
// paused containers, one running ones.
const createTemplates = `template warmpaused {
			image %[1]s
			ports 8080
			memory_mb 64
			pool {
				min_idle 1
				state paused
			}
		}
		template warmrunning {
			image %[1]s
			ports 8080
			memory_mb 64
			pool {
				min_idle 1
				state running
			}
		}`

// createLatency times, alternately, each way of getting a new sandbox's
// first byte: through the gateway, create → first byte at the preview URL
// for a pool hit (paused pool, running pool) and a cold create; raw, docker
// create + start + the first byte at the container's address. Each
// sandbox is destroyed and purged after it answered; a pool is refilled
// before it is claimed again.
func createLatency(ctx context.Context, b *bench, iterations int) (*table, error) {
	g, err := b.startGateway(ctx, "create", fmt.Sprintf(createTemplates, b.image), false)
	if err != nil {
		return nil, err
	}
	defer g.stop()
	c := loopbackClient(4)
	type kind struct {
		name string
		body func(id string) map[string]any
		pool string // the template whose pool must hold an idle container
	}
	kinds := []kind{
		{"pool hit, paused pool", func(string) map[string]any { return map[string]any{"template": "warmpaused", "pool": "require"} }, "warmpaused"},
		{"pool hit, running pool", func(string) map[string]any { return map[string]any{"template": "warmrunning", "pool": "require"} }, "warmrunning"},
		{"cold create", func(id string) map[string]any {
			return map[string]any{"id": id, "image": b.image, "ports": []int{8080}, "memory_mb": 64}
		}, ""},
	}
	times := make([][]time.Duration, len(kinds))
	var raw []time.Duration
	for i := -1; i < iterations; i++ { // one untimed round first
		for k, kd := range kinds {
			if kd.pool != "" {
				if err := g.awaitPool(ctx, kd.pool); err != nil {
					return nil, err
				}
			}
			id := fmt.Sprintf("c%s%d%d", testenv.RunID(), k, i+1)
			t0 := time.Now()
			var rec record
			code, body, err := g.api(ctx, "POST", "/v1/sandboxes", kd.body(id), &rec)
			if err != nil || code != http.StatusCreated {
				return nil, fmt.Errorf("%s: create: %d %s %v", kd.name, code, body, err)
			}
			if _, err := firstByte(ctx, c, g.previewURL(rec.ID, "/healthz")); err != nil {
				return nil, fmt.Errorf("%s: first byte: %w", kd.name, err)
			}
			d := time.Since(t0)
			if i >= 0 {
				times[k] = append(times[k], d)
			}
			if code, body, err := g.api(ctx, "POST", "/v1/sandboxes/"+rec.ID+"/purge", nil, nil); err != nil || code != 200 {
				return nil, fmt.Errorf("%s: purge %s: %d %s %v", kd.name, rec.ID, code, body, err)
			}
		}
		d, err := rawCreate(ctx, b.cli, b.image, fmt.Sprintf("sandwake-bench-create-%s-%d", testenv.RunID(), i+1))
		if err != nil {
			return nil, err
		}
		if i >= 0 {
			raw = append(raw, d)
		}
	}
	t := &table{
		title: "Create: create → first byte through the gateway vs raw docker create + start + first byte",
		note:  fmt.Sprintf("%d of each, alternated; pool hits with \"pool\": \"require\"; raw = docker create and start of the same image, then an HTTP GET at the container's address polled from 5 ms until its first byte", iterations),
	}
	rs := sortedCopy(raw)
	for k, kd := range kinds {
		ts := sortedCopy(times[k])
		t.add(ratioRow(kd.name+", p50", percentile(rs, 50).Seconds(), percentile(ts, 50).Seconds(), fmtSeconds, info))
		t.add(ratioRow(kd.name+", max", rs[len(rs)-1].Seconds(), ts[len(ts)-1].Seconds(), fmtSeconds, info))
		progress("create: %s: p50 %s (raw %s)", kd.name, fmtDuration(percentile(ts, 50)), fmtDuration(percentile(rs, 50)))
	}
	t.add(valueRow("pool hit (paused) p50", "", percentile(sortedCopy(times[0]), 50).Seconds(), fmtSeconds, goal{op: "<=", limit: 0.015, format: fmtSeconds}))
	return t, nil
}

// awaitPool waits until template's pool holds an idle container.
func (g *gateway) awaitPool(ctx context.Context, template string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var list struct {
			Templates []struct {
				Name string `json:"name"`
				Pool *struct {
					Idle int `json:"idle"`
				} `json:"pool"`
			} `json:"templates"`
		}
		if code, _, err := g.api(ctx, "GET", "/v1/templates", nil, &list); err == nil && code == 200 {
			for _, tm := range list.Templates {
				if tm.Name == template && tm.Pool != nil && tm.Pool.Idle > 0 {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("template %s: no idle pool container after 60 s", template)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rawCreate is the raw baseline of a create: docker create and start of
// image on the raw twins' network, then the first byte at its address;
// the container is removed after.
func rawCreate(ctx context.Context, cli *client.Client, image, name string) (time.Duration, error) {
	net, err := twinNetwork(ctx, cli)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	if _, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name,
		Config: &container.Config{Image: image, Labels: testenv.Labels()},
		HostConfig: &container.HostConfig{NetworkMode: container.NetworkMode(net), Resources: container.Resources{Memory: 64 << 20},
			// A workspace volume, as a sandbox has (anonymous: it goes
			// with the container).
			Mounts: []mount.Mount{{Type: mount.TypeVolume, Target: "/workspace"}}}}); err != nil {
		return 0, fmt.Errorf("raw create: %w", err)
	}
	defer cli.ContainerRemove(context.WithoutCancel(ctx), name, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	r := &rawContainer{cli: cli, name: name}
	if err := r.start(ctx); err != nil {
		return 0, fmt.Errorf("raw create: %w", err)
	}
	return time.Since(t0), nil
}

// groupTemplates are the services scenario's templates: the same app
// alone, and with a service (a second test app on 127.0.0.1:5432, ready
// by a probe inside the group's namespace), each with a paused pool.
const groupTemplates = `template single {
			image %[1]s
			ports 8080
			memory_mb 64
			pool {
				min_idle 1
				state paused
			}
		}
		template group {
			image %[1]s
			ports 8080
			memory_mb 64
			service db {
				image %[1]s
				memory_mb 32
				ready tcp:5432
				env PORT 5432
				env LISTEN_HOST 127.0.0.1
			}
			pool {
				min_idle 1
				state paused
			}
		}`

// groupLatency puts a group (the app and one service) beside a single
// container, alternated on one gateway: a pool claim → first byte, a
// cold create → first byte, and a wake from stopped → first byte.
func groupLatency(ctx context.Context, b *bench, iterations int) (*table, error) {
	g, err := b.startGateway(ctx, "group", fmt.Sprintf(groupTemplates, b.image), false)
	if err != nil {
		return nil, err
	}
	defer g.stop()
	c := loopbackClient(4)
	var claims, colds, wakes [2][]time.Duration
	names := [2]string{"single", "group"}
	for i := -1; i < iterations; i++ {
		for k := range 2 {
			side := (k + i + 2) % 2
			tmpl := names[side]
			if err := g.awaitPool(ctx, tmpl); err != nil {
				return nil, err
			}
			t0 := time.Now()
			var rec record
			code, body, err := g.api(ctx, "POST", "/v1/sandboxes", map[string]any{"template": tmpl, "pool": "require"}, &rec)
			if err != nil || code != http.StatusCreated {
				return nil, fmt.Errorf("%s: claim: %d %s %v", tmpl, code, body, err)
			}
			if _, err := firstByte(ctx, c, g.previewURL(rec.ID, "/healthz")); err != nil {
				return nil, fmt.Errorf("%s: first byte after a claim: %w", tmpl, err)
			}
			dClaim := time.Since(t0)
			id := fmt.Sprintf("g%s%d%d", testenv.RunID(), side, i+1)
			t0 = time.Now()
			code, body, err = g.api(ctx, "POST", "/v1/sandboxes", map[string]any{"id": id, "template": tmpl, "pool": "bypass"}, nil)
			if err != nil || code != http.StatusCreated {
				return nil, fmt.Errorf("%s: cold create: %d %s %v", tmpl, code, body, err)
			}
			if _, err := firstByte(ctx, c, g.previewURL(id, "/healthz")); err != nil {
				return nil, fmt.Errorf("%s: first byte after a cold create: %w", tmpl, err)
			}
			dCold := time.Since(t0)
			if err := g.act(ctx, id, "stop", "stopped"); err != nil {
				return nil, err
			}
			dWake, err := firstByte(ctx, c, g.previewURL(id, "/healthz"))
			if err != nil {
				return nil, fmt.Errorf("%s: wake: %w", tmpl, err)
			}
			if i >= 0 {
				claims[side] = append(claims[side], dClaim)
				colds[side] = append(colds[side], dCold)
				wakes[side] = append(wakes[side], dWake)
			}
			for _, sid := range []string{rec.ID, id} {
				if code, body, err := g.api(ctx, "POST", "/v1/sandboxes/"+sid+"/purge", nil, nil); err != nil || code != 200 {
					return nil, fmt.Errorf("%s: purge %s: %d %s %v", tmpl, sid, code, body, err)
				}
			}
		}
	}
	t := &table{
		title: "Services: a group (app + one service) vs a single container",
		note:  fmt.Sprintf("%d of each, alternated on one gateway; the service is a second test app on 127.0.0.1:5432, ready by a tcp probe inside the group's namespace; pools paused", iterations),
		sides: [2]string{"single", "group"},
	}
	for _, row := range []struct {
		name string
		v    [2][]time.Duration
		g    goal
	}{
		{"pool claim → first byte, p50", claims, atMost(2.0)},
		{"pool claim → first byte, mean", claims, info},
		{"cold create → first byte, p50", colds, info},
		{"wake from stopped → first byte, p50", wakes, info},
		{"wake from stopped → first byte, mean", wakes, info},
	} {
		a, z := sortedCopy(row.v[0]), sortedCopy(row.v[1])
		va, vz := percentile(a, 50), percentile(z, 50)
		if strings.HasSuffix(row.name, "mean") {
			va, vz = mean(a), mean(z)
		}
		t.add(ratioRow(row.name, va.Seconds(), vz.Seconds(), fmtSeconds, row.g))
	}
	progress("services: claim %s → %s, wake %s → %s (p50, single → group)",
		fmtDuration(percentile(sortedCopy(claims[0]), 50)), fmtDuration(percentile(sortedCopy(claims[1]), 50)),
		fmtDuration(percentile(sortedCopy(wakes[0]), 50)), fmtDuration(percentile(sortedCopy(wakes[1]), 50)))
	return t, nil
}
