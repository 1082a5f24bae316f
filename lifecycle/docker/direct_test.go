package docker_test

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
	"github.com/sandwake/sandwake/store"
)

// dockerProxies counts the docker-proxy processes that forward to addr (the
// userland proxy of a port published for a container at that address).
func dockerProxies(t *testing.T, addr netip.Addr) int {
	t.Helper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("-container-ip\x00" + addr.String() + "\x00")
	n := 0
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the process ended meanwhile
		}
		if bytes.Contains(b, []byte("docker-proxy")) && bytes.Contains(b, want) {
			n++
		}
	}
	return n
}

// containerIP is the address of sandbox id's container on the sandbox
// network, as Docker reports it.
func containerIP(t *testing.T, cli *client.Client, id string) netip.Addr {
	t.Helper()
	res, err := cli.ContainerInspect(context.Background(), docker.ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ep := res.Container.NetworkSettings.Networks[testenv.Network()]
	if ep == nil || !ep.IPAddress.IsValid() {
		t.Fatalf("sandbox %s has no address on %s", id, testenv.Network())
	}
	return ep.IPAddress.Unmap()
}

// portBindings is the number of ports the container of sandbox id has
// published on the host.
func portBindings(t *testing.T, cli *client.Client, id string) int {
	t.Helper()
	res, err := cli.ContainerInspect(context.Background(), docker.ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, bs := range res.Container.HostConfig.PortBindings {
		n += len(bs)
	}
	return n
}

// TestDirectPublishesNothing: on this machine (a local engine, the sandbox
// bridge in the test's namespace) the runtime chooses upstream mode direct:
// a sandbox is dialled at its own address, publishes no port, and no
// docker-proxy runs for it, through create, stop and wake.
func TestDirectPublishesNothing(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{})
	if mode, why := f.rt.UpstreamMode(context.Background()); mode != docker.UpstreamDirect {
		t.Fatalf("upstream mode %s (%s), want direct on a local engine", mode, why)
	}
	check := func(rec lifecycle.Record) {
		t.Helper()
		ip := containerIP(t, f.cli, rec.ID)
		if got, want := rec.Upstreams[8080], netip.AddrPortFrom(ip, 8080).String(); got != want {
			t.Fatalf("upstream %s, want the sandbox's own address %s", got, want)
		}
		if code, body := get(t, rec.Upstreams[8080], "/healthz"); code != 200 {
			t.Fatalf("the app at its address: %d %s", code, body)
		}
		if n := portBindings(t, f.cli, rec.ID); n != 0 {
			t.Fatalf("the container publishes %d ports", n)
		}
		if n := dockerProxies(t, ip); n != 0 {
			t.Fatalf("%d docker-proxy processes forward to the sandbox", n)
		}
	}
	check(rec)
	if _, err := f.m.Stop(context.Background(), rec.ID, "test"); err != nil {
		t.Fatal(err)
	}
	woken, err := f.m.Wake(context.Background(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	check(woken)
}

// TestPublishedModeStillWorks: upstream_mode published on the real engine
// publishes each port on loopback, with Docker's proxy in front (the
// counter above sees it), and wakes as before.
func TestPublishedModeStillWorks(t *testing.T) {
	f := newFixtureWith(t, lifecycle.Config{}, func(o *docker.Options) { o.UpstreamMode = docker.UpstreamPublished })
	rec := f.create(lifecycle.Spec{})
	addr := upstream(t, lifecycle.Record{Spec: rec.Spec, Upstreams: rec.Upstreams}) // on loopback
	if code, body := get(t, addr, "/healthz"); code != 200 {
		t.Fatalf("the app at its published port: %d %s", code, body)
	}
	if n := portBindings(t, f.cli, rec.ID); n != 1 {
		t.Fatalf("the container publishes %d ports, want 1", n)
	}
	if n := dockerProxies(t, containerIP(t, f.cli, rec.ID)); n != 1 {
		t.Fatalf("%d docker-proxy processes forward to the sandbox, want 1", n)
	}
}

// TestUpgradeToDirect: sandboxes made by a gateway in upstream mode
// published (today's release) are dialled at their addresses as soon as a
// gateway in direct mode has run its boot reconcile; their port bindings go
// at their next recreate (a wake from stopped), volume kept.
func TestUpgradeToDirect(t *testing.T) {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	dir := t.TempDir()
	instance := "t" + testenv.RunID() // the fixtures' instance: the network is theirs
	// open opens a gateway's engine as the gateway does: the upstream mode
	// is settled before the boot reconcile.
	open := func(mode string) (*lifecycle.Manager, func()) {
		st, err := store.Open(store.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		rt, err := docker.New(docker.Options{Labels: testenv.Labels(), StopTimeout: 5 * time.Second, Instance: instance,
			SandboxNetwork: testenv.Network(), UpstreamMode: mode})
		if err != nil {
			t.Fatal(err)
		}
		m, err := lifecycle.NewManager(st, rt, lifecycle.Config{})
		if err != nil {
			t.Fatal(err)
		}
		rt.UpstreamMode(context.Background())
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
		return m, func() { m.Close(); rt.Close(); st.Close() }
	}
	ids := []string{testenv.UniqueID("ur"), testenv.UniqueID("us")}
	for _, id := range ids {
		t.Cleanup(func() {
			cli.ContainerRemove(context.Background(), docker.ContainerName(id), client.ContainerRemoveOptions{Force: true})
			cli.VolumeRemove(context.Background(), docker.VolumeName(id), client.VolumeRemoveOptions{Force: true})
		})
	}
	old, closeOld := open(docker.UpstreamPublished)
	ctx := context.Background()
	for _, id := range ids {
		if _, err := old.Create(ctx, lifecycle.CreateRequest{ID: id, Spec: lifecycle.Spec{Image: image, Ports: []int{8080}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := old.Stop(ctx, ids[1], "test"); err != nil {
		t.Fatal(err)
	}
	closeOld()

	m, closeNew := open(docker.UpstreamAuto)
	defer closeNew()
	if _, err := m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	running, err := m.Get(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if got, want := running.Upstreams[8080], netip.AddrPortFrom(containerIP(t, cli, ids[0]), 8080).String(); got != want {
		t.Fatalf("after the upgrade the running sandbox's upstream is %s, want its address %s", got, want)
	}
	if code, body := get(t, running.Upstreams[8080], "/healthz"); code != 200 {
		t.Fatalf("the running sandbox at its address after the upgrade: %d %s", code, body)
	}
	// Its bindings stay until it is made again; the stopped one is made
	// again at its wake, the running one at the wake after a stop.
	if _, err := m.Stop(ctx, ids[0], "test"); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		rec, err := m.Wake(ctx, id)
		if err != nil {
			t.Fatalf("wake %s: %v", id, err)
		}
		if rec.Reason != "recreate" {
			t.Errorf("sandbox %s woke by %s, want recreate", id, rec.Reason)
		}
		if n := portBindings(t, cli, id); n != 0 {
			t.Errorf("sandbox %s still publishes %d ports after its recreate", id, n)
		}
		if n := dockerProxies(t, containerIP(t, cli, id)); n != 0 {
			t.Errorf("%d docker-proxy processes still forward to sandbox %s", n, id)
		}
		if code, body := get(t, rec.Upstreams[8080], "/healthz"); code != 200 {
			t.Errorf("sandbox %s after its recreate: %d %s", id, code, body)
		}
	}
}
