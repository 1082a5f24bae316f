package docker_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// groupSpec is the test app with a second test app playing a database:
// listening on 127.0.0.1:5432 only, inside the group's namespace, and the
// app fetching from it before it listens.
func groupSpec(f *fixture, ready string) lifecycle.Spec {
	return lifecycle.Spec{
		Image: f.image, Ports: []int{8080}, MemoryMB: 64,
		Env: map[string]string{"FETCH_AT_START": "http://127.0.0.1:5432/healthz"},
		Services: map[string]lifecycle.Service{
			"db": {Image: f.image, MemoryMB: 32, Ready: ready, Env: map[string]string{"PORT": "5432", "LISTEN_HOST": "127.0.0.1", "STARTUP_DELAY": "300ms"}},
		},
	}
}

// cleanupGroup removes every container and volume of sandbox id's group.
func (f *fixture) cleanupGroup(id string) {
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		fl := client.Filters{}.Add("label", docker.LabelID+"="+id)
		if res, err := f.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: fl}); err == nil {
			for _, c := range res.Items {
				f.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
			}
		}
		if res, err := f.cli.VolumeList(ctx, client.VolumeListOptions{Filters: fl}); err == nil {
			for _, v := range res.Items {
				f.cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true})
			}
		}
	})
}

func (f *fixture) createGroup(spec lifecycle.Spec) (lifecycle.Record, error) {
	id := testenv.UniqueID("g")
	f.cleanupGroup(id)
	return f.m.Create(context.Background(), lifecycle.CreateRequest{ID: id, Spec: spec})
}

// states reads each member's state from the engine.
func (f *fixture) states(id string) map[string]string {
	f.t.Helper()
	out := map[string]string{}
	for _, name := range []string{docker.ContainerName(id), docker.MemberName(id, "net"), docker.MemberName(id, "db")} {
		res, err := f.cli.ContainerInspect(context.Background(), name, client.ContainerInspectOptions{})
		if err != nil {
			out[name] = "missing"
			continue
		}
		out[name] = string(res.Container.State.Status)
	}
	return out
}

func (f *fixture) allIn(id, state string) bool {
	for _, s := range f.states(id) {
		if s != state {
			return false
		}
	}
	return true
}

// TestServicesRunAsAGroup: a group of the app and a service listening on
// 127.0.0.1 only shares one network namespace (the app reaches it on
// localhost, and saw it ready on its first request); pause and stop act on
// both; a wake starts the namespace's owner, then the service, ready,
// then the app, in that order (Docker's own events say it).
func TestServicesRunAsAGroup(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec, err := f.createGroup(groupSpec(f, "http:5432/healthz"))
	if err != nil {
		t.Fatal(err)
	}
	addr := upstream(t, rec)
	if code, body := get(t, addr, "/startfetch"); code != 200 || !strings.HasPrefix(body, "ok 200 ok") {
		t.Errorf("the app's first request to its service: %d %q (want it ready before the app started)", code, body)
	}
	if code, body := get(t, addr, "/fetch?url=http://127.0.0.1:5432/healthz"); code != 200 || !strings.HasPrefix(body, "ok 200") {
		t.Errorf("the app reaching its service on localhost: %d %q", code, body)
	}
	if rec.ServiceStates["db"] != lifecycle.ContainerRunning || rec.Spec.GroupMemoryMB() != 96 {
		t.Errorf("record: service states %v, group memory %d MiB (want db running, 96)", rec.ServiceStates, rec.Spec.GroupMemoryMB())
	}
	ctx := context.Background()
	// The infra container is locked down, with room for runc's init (at
	// Docker's 6 MB floor a start on a loaded host died before the
	// program ran).
	infra, err := f.cli.ContainerInspect(ctx, docker.MemberName(rec.ID, "net"), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hc := infra.Container.HostConfig; hc.Memory < 16<<20 || hc.MemorySwap != hc.Memory || !hc.ReadonlyRootfs || !slices.Equal(hc.CapDrop, []string{"ALL"}) || hc.PidsLimit == nil || *hc.PidsLimit > 8 {
		t.Errorf("the infra container's limits: memory %d swap %d read-only %v cap_drop %v pids %v", hc.Memory, hc.MemorySwap, hc.ReadonlyRootfs, hc.CapDrop, hc.PidsLimit)
	}
	if _, err := f.m.Pause(ctx, rec.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if s := f.states(rec.ID); s[docker.ContainerName(rec.ID)] != "paused" || s[docker.MemberName(rec.ID, "db")] != "paused" {
		t.Errorf("after pause: %v", s)
	}
	if _, err := f.m.Wake(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if !f.allIn(rec.ID, "running") {
		t.Errorf("after a wake from paused: %v", f.states(rec.ID))
	}
	if _, err := f.m.Stop(ctx, rec.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if !f.allIn(rec.ID, "exited") {
		t.Errorf("after stop: %v", f.states(rec.ID))
	}
	since := time.Now()
	woken, err := f.m.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, upstream(t, woken), "/startfetch"); code != 200 || !strings.HasPrefix(body, "ok 200 ok") {
		t.Errorf("after a wake from stopped, the app's first request to its service: %d %q", code, body)
	}
	// The order the engine started them in.
	ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res := f.cli.Events(ectx, client.EventsListOptions{Since: since.Format(time.RFC3339Nano), Until: time.Now().Format(time.RFC3339Nano),
		Filters: client.Filters{}.Add("type", "container").Add("event", "start").Add("label", docker.LabelID+"="+rec.ID)})
	var order []string
	for done := false; !done; {
		select {
		case m, ok := <-res.Messages:
			if !ok {
				done = true
				break
			}
			order = append(order, m.Actor.Attributes["name"])
		case err := <-res.Err:
			if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "EOF") {
				t.Fatal(err)
			}
			done = true
		}
	}
	want := []string{docker.MemberName(rec.ID, "net"), docker.MemberName(rec.ID, "db"), docker.ContainerName(rec.ID)}
	if !slices.Equal(order, want) {
		t.Errorf("start order %v, want %v", order, want)
	}
}

// TestAServiceThatNeverBecomesReadyFailsTheWake: the wake fails naming
// the service, and nothing of the group is left running.
func TestAServiceThatNeverBecomesReadyFailsTheWake(t *testing.T) {
	f := newFixture(t, lifecycle.Config{WakeTimeout: 4 * time.Second})
	spec := groupSpec(f, "tcp:5433") // the service listens on 5432
	_, err := f.createGroup(spec)
	var se *lifecycle.ServiceError
	if !errors.As(err, &se) || se.Service != "db" || !strings.Contains(err.Error(), "service db") {
		t.Fatalf("create: %v, want a ServiceError naming db", err)
	}
	recs, _ := f.store.List(nil)
	for _, r := range recs {
		if r.State == lifecycle.Error && r.Reason == "service_failed" && strings.Contains(r.Error, "service db") {
			if s := f.states(r.ID); s[docker.ContainerName(r.ID)] == "running" || s[docker.MemberName(r.ID, "db")] == "running" || s[docker.MemberName(r.ID, "net")] == "running" {
				t.Errorf("a member still runs after the failed wake: %v", s)
			}
			evs, _ := f.m.EventsAfter(0, 1000)
			if !slices.ContainsFunc(evs, func(e lifecycle.Event) bool {
				return e.Type == lifecycle.EventServiceFailed && e.SandboxID == r.ID && strings.HasPrefix(e.Reason, "db: ")
			}) {
				t.Errorf("no sandbox.service_failed event naming db")
			}
			return
		}
	}
	t.Fatalf("no record in error with reason service_failed: %+v", recs)
}

// TestAKilledServiceIsTheGroupsProblem: a service killed behind
// sandwake's back makes reconcile stop the group (nothing runs half a
// group), and the next wake brings all of it back.
func TestAKilledServiceIsTheGroupsProblem(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec, err := f.createGroup(groupSpec(f, "tcp:5432"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.cli.ContainerKill(ctx, docker.MemberName(rec.ID, "db"), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got := mustState(t, f.store, rec.ID, lifecycle.Stopped)
	if s := f.states(rec.ID); s[docker.ContainerName(rec.ID)] == "running" {
		t.Errorf("the app still runs without its service: %v", s)
	}
	if !strings.HasPrefix(got.Reason, "exited") {
		t.Errorf("reason %q", got.Reason)
	}
	woken, err := f.m.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !f.allIn(rec.ID, "running") { // db "missing" fails it
		t.Errorf("after the wake the service was not made again: %v", f.states(rec.ID))
	}
	if code, body := get(t, upstream(t, woken), "/fetch?url=http://127.0.0.1:5432/healthz"); code != 200 {
		t.Errorf("the app reaching its service after the repair: %d %q", code, body)
	}
}

// TestARemovedServiceIsTheGroupsProblem: a service's container removed
// behind sandwake's back (docker rm -f) is found by reconcile, which stops
// the group (the app does not run on without its service), and the next
// wake makes the service again, ready before the app; a stopped group
// whose service was removed is made again by its wake.
func TestARemovedServiceIsTheGroupsProblem(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec, err := f.createGroup(groupSpec(f, "tcp:5432"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.cli.ContainerRemove(ctx, docker.MemberName(rec.ID, "db"), client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := f.store.Get(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State == lifecycle.Running {
		t.Fatalf("after reconcile the group without its service is %s (%s); containers %v", got.State, got.Reason, f.states(rec.ID))
	}
	if s := f.states(rec.ID); s[docker.ContainerName(rec.ID)] == "running" {
		t.Errorf("the app still runs without its service: %v", s)
	}
	woken, err := f.m.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !f.allIn(rec.ID, "running") { // db "missing" fails it
		t.Errorf("after the wake the service was not made again: %v", f.states(rec.ID))
	}
	if code, body := get(t, upstream(t, woken), "/fetch?url=http://127.0.0.1:5432/healthz"); code != 200 {
		t.Errorf("the app reaching its service after the repair: %d %q", code, body)
	}
	// Stopped, its service removed, woken with no reconcile between: the
	// wake makes the group again rather than start the app alone.
	if _, err := f.m.Stop(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.ContainerRemove(ctx, docker.MemberName(rec.ID, "db"), client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if woken, err = f.m.Wake(ctx, rec.ID); err != nil {
		t.Fatalf("waking a stopped group without its service: %v", err)
	}
	if !f.allIn(rec.ID, "running") {
		t.Errorf("after the second wake: %v", f.states(rec.ID))
	}
	if code, body := get(t, upstream(t, woken), "/fetch?url=http://127.0.0.1:5432/healthz"); code != 200 {
		t.Errorf("the app reaching its service after the second wake: %d %q", code, body)
	}
}

// TestAGroupIsAdmittedByItsSummedMemory: the host's memory bounds the
// group's sum, not the app's alone.
func TestAGroupIsAdmittedByItsSummedMemory(t *testing.T) {
	f := newFixture(t, lifecycle.Config{HostMemoryMB: 100})
	spec := groupSpec(f, "")
	spec.MemoryMB = 64
	spec.Services["db"] = lifecycle.Service{Image: f.image, MemoryMB: 64}
	_, err := f.createGroup(spec)
	if !errors.Is(err, lifecycle.ErrInvalid) || !strings.Contains(err.Error(), "128 MiB") {
		t.Fatalf("a group of 64+64 MiB on a 100 MiB host: %v", err)
	}
}

// TestAPoolKeepsWholeGroups: a template with services pools whole groups
// (paused, every member), and a claim takes one: the app answers at once
// and reaches its service, whose container was made before the create.
func TestAPoolKeepsWholeGroups(t *testing.T) {
	image := testenv.TestAppImage(t)
	tmpl := lifecycle.Template{Name: "web", Spec: lifecycle.Spec{Image: image, Ports: []int{8080}, MemoryMB: 64,
		Services: map[string]lifecycle.Service{"db": {Image: image, MemoryMB: 32, Ready: "tcp:5432", Env: map[string]string{"PORT": "5432", "LISTEN_HOST": "127.0.0.1"}}}},
		Pool: lifecycle.PoolConfig{MinIdle: 1}}
	if err := lifecycle.NormalizeTemplate(&tmpl); err != nil {
		t.Fatal(err)
	}
	f, _ := poolFixture(t, 1, lifecycle.Config{Templates: []lifecycle.Template{tmpl}})
	waitIdle(t, f.m, 1)
	ctx := context.Background()
	var pooled string
	res, err := f.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", docker.LabelPool).Add("label", docker.LabelMember+"=db")})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range res.Items {
		if c.Labels[docker.LabelPoolKey] != "" && c.State == "paused" {
			pooled = c.Labels[docker.LabelID]
		}
	}
	if pooled == "" {
		t.Fatalf("no paused service container in the pool: %+v", res.Items)
	}
	dbBefore, err := f.cli.ContainerInspect(ctx, docker.MemberName(pooled, "db"), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, out, err := f.m.CreatePooled(ctx, lifecycle.CreateRequest{Template: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if !out.Hit || rec.ID != pooled {
		t.Fatalf("claim: hit %v id %s, want the pooled group %s", out.Hit, rec.ID, pooled)
	}
	if !f.allIn(rec.ID, "running") {
		t.Errorf("after the claim: %v", f.states(rec.ID))
	}
	dbAfter, err := f.cli.ContainerInspect(ctx, docker.MemberName(rec.ID, "db"), client.ContainerInspectOptions{})
	if err != nil || dbAfter.Container.ID != dbBefore.Container.ID {
		t.Errorf("the claimed group's service is not the pooled one: %v", err)
	}
	if code, body := get(t, upstream(t, rec), "/fetch?url=http://127.0.0.1:5432/healthz"); code != 200 {
		t.Errorf("the claimed app reaching its service: %d %q", code, body)
	}
	waitIdle(t, f.m, 1)
}

// TestTheDiskWatchdogMeasuresEveryMember: what a service writes to its
// own volume counts toward the sandbox's disk and is shown as the
// service's part; a service over its own disk_mb stops the group; the
// volume is kept across a destroy and removed by a purge.
func TestTheDiskWatchdogMeasuresEveryMember(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	spec := groupSpec(f, "tcp:5432")
	spec.Env = nil
	spec.Services["db"] = lifecycle.Service{Image: f.image, Ready: "tcp:5432", Env: map[string]string{"PORT": "5432"}, DiskMB: 6}
	rec, err := f.createGroup(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before, err := f.rt.DiskUsage(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	ap, _ := netip.ParseAddrPort(upstream(t, rec))
	db := netip.AddrPortFrom(ap.Addr(), 5432).String()
	req, _ := http.NewRequest(http.MethodPut, "http://"+db+"/files/big", bytes.NewReader(make([]byte, 4<<20)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("writing 4 MiB into the service's volume: %v %v", resp, err)
	}
	resp.Body.Close()
	after, err := f.rt.DiskUsage(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 4<<20 {
		t.Errorf("the sandbox's disk grew by %d bytes after its service wrote 4 MiB", after-before)
	}
	// The watchdog keeps the service's part apart, and 4 MiB is within
	// the service's 6.
	if n, err := f.m.DiskCheckOnce(ctx, f.rt); err != nil || n != 0 {
		t.Fatalf("disk check within the quotas: stopped %d, %v", n, err)
	}
	if used := f.m.ServiceDiskUsed(rec.ID)["db"]; used < 4<<20 {
		t.Errorf("the service's part of the measure is %d bytes after it wrote 4 MiB (%v)", used, f.m.ServiceDiskUsed(rec.ID))
	}
	if total, _ := f.m.DiskUsed(rec.ID); total < f.m.ServiceDiskUsed(rec.ID)["db"] {
		t.Errorf("the sandbox's measure %d is less than its service's part", total)
	}
	// 4 MiB more: the service is over its own 6 MiB, and the group stops.
	req, _ = http.NewRequest(http.MethodPut, "http://"+db+"/files/more", bytes.NewReader(make([]byte, 4<<20)))
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("writing 4 MiB more into the service's volume: %v %v", resp, err)
	}
	resp.Body.Close()
	if n, err := f.m.DiskCheckOnce(ctx, f.rt); err != nil || n != 1 {
		t.Fatalf("disk check with the service over its disk_mb: stopped %d, %v; want 1", n, err)
	}
	if got, err := f.m.Get(rec.ID); err != nil || got.State != lifecycle.Stopped || got.Reason != lifecycle.ReasonDiskQuota {
		t.Fatalf("after the check: %s (%s), %v; want stopped (%s)", got.State, got.Reason, err, lifecycle.ReasonDiskQuota)
	}
	if !f.allIn(rec.ID, "exited") {
		t.Errorf("the group over a service's quota: %v, want every member exited", f.states(rec.ID))
	}
	if err := f.m.Destroy(ctx, rec.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.VolumeInspect(ctx, docker.MemberVolumeName(rec.ID, "db"), client.VolumeInspectOptions{}); err != nil {
		t.Errorf("the service's volume was not kept by the destroy: %v", err)
	}
	if _, err := f.m.Purge(ctx, rec.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.VolumeInspect(ctx, docker.MemberVolumeName(rec.ID, "db"), client.VolumeInspectOptions{}); err == nil {
		t.Errorf("the service's volume survived the purge")
	}
}
