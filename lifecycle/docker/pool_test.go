package docker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// poolFixture is a fixture of an instance of its own (so that its pool
// containers are told from other tests'), with template "web" and a pool
// of minIdle, refilled every 100 ms. Everything the instance made is
// removed at the end.
func poolFixture(t *testing.T, minIdle int, cfg lifecycle.Config) (*fixture, string) {
	t.Helper()
	instance := testenv.UniqueID("p")
	image := testenv.TestAppImage(t)
	if cfg.Templates == nil {
		cfg.Templates = []lifecycle.Template{webTemplate(image, minIdle, 64)}
	}
	cfg.PoolInterval = 100 * time.Millisecond
	f := newFixtureWith(t, cfg, func(o *docker.Options) { o.Instance, o.SandboxNetwork = instance, "" })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		f.m.Close()
		removeInstanceVolumes(ctx, f.cli, instance)
	})
	return f, instance
}

func webTemplate(image string, minIdle int, memoryMB int64) lifecycle.Template {
	t := lifecycle.Template{Name: "web", Spec: lifecycle.Spec{Image: image, Ports: []int{8080}, MemoryMB: memoryMB},
		Pool: lifecycle.PoolConfig{MinIdle: minIdle}}
	if err := lifecycle.NormalizeTemplate(&t); err != nil {
		panic(err)
	}
	return t
}

// removeInstanceVolumes removes the containers and volumes of instance.
func removeInstanceVolumes(ctx context.Context, cli *client.Client, instance string) {
	testenv.RemoveInstance(ctx, cli, instance)
	f := client.Filters{}.Add("label", testenv.LabelRun+"="+testenv.RunID()).Add("label", docker.LabelInstance+"="+instance)
	if vs, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: f}); err == nil {
		for _, v := range vs.Items {
			cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true})
		}
	}
}

// poolContainers lists the instance's containers labelled for the pool,
// by sandbox id, with their state.
func poolContainers(t *testing.T, cli *client.Client, instance string) map[string]string {
	t.Helper()
	f := client.Filters{}.Add("label", docker.LabelInstance+"="+instance).Add("label", docker.LabelPool)
	res, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range res.Items {
		out[c.Labels[docker.LabelID]] = string(c.State)
	}
	return out
}

func idle(m *lifecycle.Manager, name string) int {
	for _, t := range m.Templates() {
		if t.Template.Name == name {
			return t.Idle
		}
	}
	return -1
}

func waitIdle(t *testing.T, m *lifecycle.Manager, n int) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		got := idle(m, "web")
		return got == n, fmt.Sprintf("pool web has %d idle, want %d (%+v)", got, n, m.Templates())
	})
}

// TestPoolClaim: a create from a template claims a paused pool container:
// the sandbox answers at once, under the container's id, no container is
// made for it, and the pool is refilled. Pool containers are never
// sandboxes: no record, not listed.
func TestPoolClaim(t *testing.T) {
	f, instance := poolFixture(t, 2, lifecycle.Config{})
	waitIdle(t, f.m, 2)
	pooled := poolContainers(t, f.cli, instance)
	if len(pooled) != 2 {
		t.Fatalf("pool containers on the engine: %v", pooled)
	}
	for id, state := range pooled {
		if state != "paused" {
			t.Fatalf("pool container %s is %s, want paused", id, state)
		}
		if _, err := f.store.Get(id); !errors.Is(err, lifecycle.ErrNotFound) {
			t.Fatalf("pool container %s has a record: %v", id, err)
		}
	}
	if recs, _ := f.m.List(""); len(recs) != 0 {
		t.Fatalf("pool containers listed as sandboxes: %d", len(recs))
	}
	containerOf := map[string]string{}
	for id := range pooled {
		ci, err := f.cli.ContainerInspect(context.Background(), docker.ContainerName(id), client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		containerOf[id] = ci.Container.ID
	}
	rec, out, err := f.m.CreatePooled(context.Background(), lifecycle.CreateRequest{Template: "web",
		Spec: lifecycle.Spec{Labels: map[string]string{"team": "a"}, Access: lifecycle.AccessPrivate}})
	if err != nil {
		t.Fatal(err)
	}
	if !out.Hit {
		t.Fatalf("create from a full pool missed: %+v", out)
	}
	if _, ok := pooled[rec.ID]; !ok {
		t.Fatalf("claimed sandbox %s is not one of the pool's containers %v", rec.ID, pooled)
	}
	// The sandbox runs in the container made before the create (the
	// refill the claim started makes others).
	if rec.ContainerID == "" || rec.ContainerID != containerOf[rec.ID] {
		t.Fatalf("claimed sandbox's container %q, want the pool's %q", rec.ContainerID, containerOf[rec.ID])
	}
	mustState(t, f.store, rec.ID, lifecycle.Running)
	if rec.Template != "web" || rec.Spec.Labels["team"] != "a" || rec.Spec.Access != lifecycle.AccessPrivate || rec.Spec.MemoryMB != 64 {
		t.Fatalf("claimed record: template %q labels %v access %q memory %d", rec.Template, rec.Spec.Labels, rec.Spec.Access, rec.Spec.MemoryMB)
	}
	if code, body := get(t, upstream(t, rec), "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("claimed sandbox answers %d %q", code, body)
	}
	h, _ := f.store.History(rec.ID)
	if len(h) != 2 || h[0].Type != lifecycle.EventPoolFilled || h[1].Reason != "pool_claim" || h[1].To != lifecycle.Running {
		t.Fatalf("history of a claim: %+v", h)
	}
	// The claimed sandbox is an ordinary one: it sleeps and wakes.
	if _, err := f.m.Stop(context.Background(), rec.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Wake(context.Background(), rec.ID); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, f.m, 2)
	st := f.m.Templates()[0]
	if st.Hits != 1 || st.Refills < 3 {
		t.Fatalf("pool figures: %+v", st)
	}
	// Reconcile sees the pool's containers and leaves them alone.
	stats, err := f.m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(stats.Orphans) != 0 || idle(f.m, "web") != 2 {
		t.Fatalf("reconcile took pool containers for orphans: %v, idle %d", stats.Orphans, idle(f.m, "web"))
	}
	if err := f.m.Destroy(context.Background(), rec.ID, "test"); err != nil {
		t.Fatal(err)
	}
}

// TestPoolConcurrentClaims: creates racing for a small pool never share a
// container: every sandbox has its own id and container, the hits are at
// most the containers there were plus those refilled, and the rest are
// created cold.
func TestPoolConcurrentClaims(t *testing.T) {
	f, _ := poolFixture(t, 3, lifecycle.Config{})
	waitIdle(t, f.m, 3)
	const n = 8
	// Reconcile (and its pool sweep) runs over and over meanwhile: a
	// container being claimed is neither a leftover nor dead.
	stopReconcile := make(chan struct{})
	reconciled := make(chan int)
	go func() {
		passes := 0
		defer func() { reconciled <- passes }()
		for {
			select {
			case <-stopReconcile:
				return
			default:
			}
			if _, err := f.m.Reconcile(context.Background()); err != nil {
				t.Errorf("reconcile: %v", err)
				return
			}
			passes++
		}
	}()
	var wg sync.WaitGroup
	recs := make([]lifecycle.Record, n)
	outs := make([]lifecycle.PoolOutcome, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs[i], outs[i], errs[i] = f.m.CreatePooled(context.Background(), lifecycle.CreateRequest{Template: "web"})
		}()
	}
	wg.Wait()
	close(stopReconcile)
	if passes := <-reconciled; passes == 0 {
		t.Fatal("no reconcile ran during the claims")
	}
	if removed := f.m.PoolRemoved(); removed[lifecycle.PoolRemovedLeftover]+removed[lifecycle.PoolRemovedDied]+removed[lifecycle.PoolRemovedFailed] != 0 {
		t.Fatalf("reconcile during claims removed pool containers: %v", removed)
	}
	ids, containers := map[string]bool{}, map[string]bool{}
	hits := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if ids[recs[i].ID] || containers[recs[i].ContainerID] {
			t.Fatalf("two creates got sandbox %s / container %s", recs[i].ID, recs[i].ContainerID)
		}
		ids[recs[i].ID], containers[recs[i].ContainerID] = true, true
		if outs[i].Hit {
			hits++
		} else if outs[i].Reason != lifecycle.PoolMissEmpty {
			t.Fatalf("miss reason %q, want empty", outs[i].Reason)
		}
		mustState(t, f.store, recs[i].ID, lifecycle.Running)
		if code, _ := get(t, upstream(t, recs[i]), "/healthz"); code != 200 {
			t.Fatalf("sandbox %s answers %d", recs[i].ID, code)
		}
	}
	st := f.m.Templates()[0]
	if hits < 3 || uint64(hits) != st.Hits || st.Misses[lifecycle.PoolMissEmpty] != uint64(n-hits) {
		t.Fatalf("%d hits of %d creates with 3 idle; figures %+v", hits, n, st)
	}
}

// TestPoolCreateFields: what a create may give beside a template, and what
// it may not.
func TestPoolCreateFields(t *testing.T) {
	f, _ := poolFixture(t, 1, lifecycle.Config{})
	ctx := context.Background()
	_, _, err := f.m.CreatePooled(ctx, lifecycle.CreateRequest{Template: "web", Spec: lifecycle.Spec{Image: "other:1"}})
	if !errors.Is(err, lifecycle.ErrInvalid) || !strings.Contains(err.Error(), "image") || !strings.Contains(err.Error(), "bypass") {
		t.Fatalf("image beside a template: %v", err)
	}
	_, _, err = f.m.CreatePooled(ctx, lifecycle.CreateRequest{Template: "nope"})
	if !errors.Is(err, lifecycle.ErrInvalid) || !strings.Contains(err.Error(), "templates: web") {
		t.Fatalf("unknown template: %v", err)
	}
	_, _, err = f.m.CreatePooled(ctx, lifecycle.CreateRequest{Template: "web", Pool: "always"})
	if !errors.Is(err, lifecycle.ErrInvalid) {
		t.Fatalf("bad pool mode: %v", err)
	}
	waitIdle(t, f.m, 1)
	for _, c := range []struct {
		req    lifecycle.CreateRequest
		reason string
	}{
		{lifecycle.CreateRequest{Template: "web", Pool: lifecycle.PoolBypass, Spec: lifecycle.Spec{MemoryMB: 96}}, lifecycle.PoolMissBypass},
		{lifecycle.CreateRequest{Template: "web", ID: testenv.UniqueID("t")}, lifecycle.PoolMissID},
		{lifecycle.CreateRequest{Template: "web", Spec: lifecycle.Spec{Env: map[string]string{"K": "v"}}}, lifecycle.PoolMissEnv},
	} {
		rec, out, err := f.m.CreatePooled(ctx, c.req)
		if err != nil {
			t.Fatal(err)
		}
		if out.Hit || out.Reason != c.reason {
			t.Fatalf("%+v: outcome %+v, want a miss for %s", c.req, out, c.reason)
		}
		if rec.Template != "web" || rec.Spec.Image != f.image {
			t.Fatalf("cold create from the template: %+v", rec.Spec)
		}
		if c.reason == lifecycle.PoolMissBypass && rec.Spec.MemoryMB != 96 {
			t.Fatalf("bypass did not take memory_mb: %d", rec.Spec.MemoryMB)
		}
		if c.reason == lifecycle.PoolMissEnv && rec.Spec.Env["K"] != "v" {
			t.Fatalf("env not passed: %v", rec.Spec.Env)
		}
	}
	if idle(f.m, "web") != 1 {
		t.Fatalf("misses took from the pool: idle %d", idle(f.m, "web"))
	}
}

// TestPoolRequireFailsFast: "require" with an empty pool is ErrPoolEmpty
// and makes nothing.
func TestPoolRequireFailsFast(t *testing.T) {
	f, _ := poolFixture(t, 0, lifecycle.Config{Templates: []lifecycle.Template{webTemplate(testenv.TestAppImage(t), 0, 64)}})
	creates := f.rt.creates.Load()
	_, out, err := f.m.CreatePooled(context.Background(), lifecycle.CreateRequest{Template: "web", Pool: lifecycle.PoolRequire})
	if !errors.Is(err, lifecycle.ErrPoolEmpty) || out.Hit {
		t.Fatalf("require with no pool: %+v %v", out, err)
	}
	if f.rt.creates.Load() != creates {
		t.Fatal("a refused create made a container")
	}
	if recs, _ := f.m.List(""); len(recs) != 0 {
		t.Fatalf("a refused create left %d records", len(recs))
	}
}

// TestPoolDropsDeadAndStale: a pool container removed behind sandwake's
// back is dropped by reconcile (never served) and replaced; a template
// changed by a reload replaces its pool with containers of the new shape;
// a restarted gateway removes the pool containers it does not know and
// refills, and keeps the sandboxes claimed from the pool.
func TestPoolDropsDeadAndStale(t *testing.T) {
	f, instance := poolFixture(t, 2, lifecycle.Config{})
	ctx := context.Background()
	waitIdle(t, f.m, 2)
	var victim string
	for id := range poolContainers(t, f.cli, instance) {
		victim = id
	}
	if _, err := f.cli.ContainerRemove(ctx, docker.ContainerName(victim), client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.m.PoolRemoved()[lifecycle.PoolRemovedDied]; got != 1 {
		t.Fatalf("removed as died: %d, want 1", got)
	}
	waitIdle(t, f.m, 2)
	for id := range poolContainers(t, f.cli, instance) {
		if id == victim {
			t.Fatal("the removed container is back in the pool")
		}
	}
	rec, out, err := f.m.CreatePooled(ctx, lifecycle.CreateRequest{Template: "web"})
	if err != nil || !out.Hit {
		t.Fatalf("claim: %+v %v", out, err)
	}
	if code, _ := get(t, upstream(t, rec), "/healthz"); code != 200 {
		t.Fatalf("claimed sandbox answers %d", code)
	}
	waitIdle(t, f.m, 2)

	// A reload with a new shape: the old containers go as stale.
	old := poolContainers(t, f.cli, instance)
	f.m.Reconfigure(lifecycle.Settings{Templates: []lifecycle.Template{webTemplate(f.image, 2, 80)}})
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		now := poolContainers(t, f.cli, instance)
		fresh := 0
		for id := range now {
			if _, was := old[id]; !was {
				fresh++
			}
		}
		return fresh == 2 && len(now) == 3 && idle(f.m, "web") == 2, fmt.Sprintf("pool containers %v (before: %v)", now, old)
	})
	if got := f.m.PoolRemoved()[lifecycle.PoolRemovedStale]; got != 2 {
		t.Fatalf("removed as stale: %d, want 2", got)
	}
	for id := range poolContainers(t, f.cli, instance) {
		if id == rec.ID {
			continue
		}
		ci, err := f.cli.ContainerInspect(ctx, docker.ContainerName(id), client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ci.Container.HostConfig.Memory != 80<<20 {
			t.Fatalf("refilled container %s has memory %d, want the new template's", id, ci.Container.HostConfig.Memory)
		}
	}

	// A restart: a new manager over the same store and engine.
	before := poolContainers(t, f.cli, instance)
	f.m.Close()
	m2, err := lifecycle.NewManager(f.store, f.rt, lifecycle.Config{Templates: []lifecycle.Template{webTemplate(f.image, 2, 80)}, PoolInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Close() })
	if err := m2.Start(); err != nil {
		t.Fatal(err)
	}
	// The pool's first act sweeps them, and any reconcile would.
	if _, err := m2.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		got := m2.PoolRemoved()[lifecycle.PoolRemovedLeftover]
		return got == 2, fmt.Sprintf("removed as leftovers after a restart: %d, want 2", got)
	})
	waitIdle(t, m2, 2)
	after := poolContainers(t, f.cli, instance)
	if _, ok := after[rec.ID]; !ok {
		t.Fatal("the restart removed a claimed sandbox's container")
	}
	for id := range before {
		if _, still := after[id]; still && id != rec.ID {
			t.Fatalf("leftover pool container %s survived the restart", id)
		}
	}
	mustState(t, f.store, rec.ID, lifecycle.Running)
}

// TestPoolGoesFirstUnderPressure: memory pressure removes idle pool
// containers before it stops any sandbox.
func TestPoolGoesFirstUnderPressure(t *testing.T) {
	var mu sync.Mutex
	low := false
	avail := func() (uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		if low {
			return 1 << 20, nil
		}
		return 1 << 40, nil
	}
	f, _ := poolFixture(t, 2, lifecycle.Config{MinFreeMemory: 512 << 20, MemAvailable: avail})
	waitIdle(t, f.m, 2)
	rec := f.create(lifecycle.Spec{})
	mu.Lock()
	low = true
	mu.Unlock()
	stats, _ := f.m.ReapOnce(context.Background())
	if got := f.m.PoolRemoved()[lifecycle.PoolRemovedPressure]; got != 2 {
		t.Fatalf("pool containers removed under pressure: %d, want 2 (reap %+v)", got, stats)
	}
	// Only once the pool was empty did pressure reach the sandbox.
	if r, _ := f.store.Get(rec.ID); r.State != lifecycle.Stopped {
		t.Fatalf("sandbox is %s after the pool was emptied under pressure", r.State)
	}
}

// TestPoolReloadReplacesShape: a reload that changes the pool's state, or
// a gateway default that shapes containers (here the CPU limit), replaces
// the idle containers before any is claimed in the old shape.
func TestPoolReloadReplacesShape(t *testing.T) {
	f, instance := poolFixture(t, 1, lifecycle.Config{})
	waitIdle(t, f.m, 1)
	first := poolContainers(t, f.cli, instance)
	running := webTemplate(f.image, 1, 64)
	running.Pool.State = lifecycle.PoolRunning
	f.m.Reconfigure(lifecycle.Settings{Templates: []lifecycle.Template{running}})
	var second map[string]string
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		second = poolContainers(t, f.cli, instance)
		for id, state := range second {
			if _, old := first[id]; !old && state == "running" && len(second) == 1 && idle(f.m, "web") == 1 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("pool containers %v (before the reload: %v)", second, first)
	})
	rec, out, err := f.m.CreatePooled(context.Background(), lifecycle.CreateRequest{Template: "web"})
	if err != nil || !out.Hit {
		t.Fatalf("claim from the running pool: %+v %v", out, err)
	}
	if code, _ := get(t, upstream(t, rec), "/healthz"); code != 200 {
		t.Fatalf("claimed from a running pool: %d", code)
	}
	waitIdle(t, f.m, 1)
	before := poolContainers(t, f.cli, instance)
	delete(before, rec.ID)
	f.m.Reconfigure(lifecycle.Settings{Templates: []lifecycle.Template{running}, Isolation: lifecycle.Isolation{CPUs: 0.5}})
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		now := poolContainers(t, f.cli, instance)
		delete(now, rec.ID)
		for id := range now {
			if _, old := before[id]; old {
				return false, fmt.Sprintf("the container of the old shape %s is still in the pool", id)
			}
			ci, err := f.cli.ContainerInspect(context.Background(), docker.ContainerName(id), client.ContainerInspectOptions{})
			if err != nil || ci.Container.HostConfig.NanoCPUs != 5e8 {
				return false, fmt.Sprintf("container %s: %v", id, err)
			}
		}
		return len(now) == 1 && idle(f.m, "web") == 1, fmt.Sprintf("pool containers %v", now)
	})
}

// TestPoolOfAnotherInstanceIsLeftAlone: a second gateway on the same engine
// (another instance, removing orphans, with a pool of its own of the same
// template) neither removes nor claims the first one's pool containers.
func TestPoolOfAnotherInstanceIsLeftAlone(t *testing.T) {
	a, instA := poolFixture(t, 1, lifecycle.Config{})
	b, _ := poolFixture(t, 1, lifecycle.Config{OrphansRemove: true})
	waitIdle(t, a.m, 1)
	waitIdle(t, b.m, 1)
	poolA := poolContainers(t, a.cli, instA)
	for range 2 {
		if stats, err := b.m.Reconcile(context.Background()); err != nil || len(stats.Orphans) != 0 {
			t.Fatalf("the other gateway's reconcile: orphans %v, %v", stats.Orphans, err)
		}
	}
	rec, out, err := b.m.CreatePooled(context.Background(), lifecycle.CreateRequest{Template: "web"})
	if err != nil || !out.Hit {
		t.Fatalf("claim on the other gateway: %+v %v", out, err)
	}
	if _, ours := poolA[rec.ID]; ours {
		t.Fatalf("the other gateway claimed %s, a container of the first's pool", rec.ID)
	}
	if got := poolContainers(t, a.cli, instA); len(got) != 1 || idle(a.m, "web") != 1 {
		t.Fatalf("the first gateway's pool after the other's reconcile and claim: %v (idle %d)", got, idle(a.m, "web"))
	}
	for id := range poolA {
		if _, still := poolContainers(t, a.cli, instA)[id]; !still {
			t.Fatalf("pool container %s of %s is gone", id, instA)
		}
	}
}
