package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

// previewDo sends a request to sandbox id's port 8080 through the gateway.
func (g *gateway) previewDo(method, id, path string, body []byte) (int, string) {
	g.t.Helper()
	req, _ := http.NewRequest(method, fmt.Sprintf("http://s-%s-8080.preview.localhost:%d%s", id, g.previewPort, path), bytes.NewReader(body))
	resp, err := g.previewClient().Do(req)
	if err != nil {
		g.t.Fatalf("%s %s on %s: %v", method, path, id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// createSpec creates sandbox id from spec (and removes it at the end).
func (g *gateway) createSpec(cli *client.Client, id string, spec map[string]any) {
	g.t.Helper()
	g.t.Cleanup(func() {
		cli.ContainerRemove(context.Background(), "s-"+id, client.ContainerRemoveOptions{Force: true})
		cli.VolumeRemove(context.Background(), "s-"+id+"-data", client.VolumeRemoveOptions{Force: true})
	})
	body := map[string]any{"id": id}
	for k, v := range spec {
		body[k] = v
	}
	if code, resp := g.api("POST", "/v1/sandboxes", body, nil); code != 201 {
		g.t.Fatalf("create %s: %d %s", id, code, resp)
	}
}

// objectIDs reads the engine ids of sandbox id's container and volume
// ("" when missing) and the container's labels.
func objectIDs(t *testing.T, cli *client.Client, id string) (containerID, volume string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	if res, err := cli.ContainerInspect(ctx, "s-"+id, client.ContainerInspectOptions{}); err == nil {
		containerID, labels = res.Container.ID, res.Container.Config.Labels
	}
	if res, err := cli.VolumeInspect(ctx, "s-"+id+"-data", client.VolumeInspectOptions{}); err == nil {
		volume = res.Volume.Name + "@" + res.Volume.CreatedAt
	}
	return containerID, volume, labels
}

// TestTwoGatewaysOneEngine runs two gateways (two built Caddy processes,
// default options but for their instance names) on this machine's Docker
// engine, as staging and production on one host: neither may destroy,
// replace, mount or reap what the other made, nor anything sandwake never
// made.
func TestTwoGatewaysOneEngine(t *testing.T) {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	bin := buildCaddy(t)

	a := newGateway(t, bin, "orphans remove\n\t\treconcile_interval 1s")
	a.start()
	x := testenv.UniqueID("x")
	a.create(cli, image, x, nil)
	if code, body := a.previewDo("PUT", x, "/files/owner.txt", []byte("gateway A")); code != 201 {
		t.Fatalf("writing A's file: %d %s", code, body)
	}
	// B starts after A's sandbox exists: its boot reconcile, with orphans
	// remove, sees A's container.
	b := newGateway(t, bin, "orphans remove\n\t\treconcile_interval 1s")
	b.start()
	cidBefore, volBefore, labels := objectIDs(t, cli, x)
	if cidBefore == "" || volBefore == "" {
		t.Fatal("A's container or volume is missing before the test starts")
	}
	if labels["sandwake.instance"] == "" {
		t.Fatalf("A's container carries no instance label: %v", labels)
	}

	// 1. B has no record of x: every operation on it is 404 and touches
	// nothing.
	for _, op := range []struct{ method, path string }{
		{"POST", "/v1/sandboxes/" + x + "/purge"},
		{"DELETE", "/v1/sandboxes/" + x},
		{"POST", "/v1/sandboxes/" + x + "/stop"},
		{"POST", "/v1/sandboxes/" + x + "/pause"},
		{"POST", "/v1/sandboxes/" + x + "/wake"},
	} {
		if code, body := b.api(op.method, op.path, nil, nil); code != 404 {
			t.Errorf("%s %s on B: %d %s; want 404", op.method, op.path, code, body)
		}
	}
	// 2. B cannot take the id: 409 id_taken, A's container and volume as
	// they were, and B keeps no record.
	code, body := b.api("POST", "/v1/sandboxes", map[string]any{"id": x, "image": image, "ports": []int{8080}, "memory_mb": 32}, nil)
	if code != 409 || !strings.Contains(body, "id_taken") {
		t.Fatalf("create of A's id on B: %d %s; want 409 id_taken", code, body)
	}
	if code, _ := b.api("GET", "/v1/sandboxes/"+x, nil, nil); code != 404 {
		t.Fatalf("B kept a record of the refused create: %d", code)
	}
	// 3. B restarts (another boot reconcile with orphans remove) and runs
	// periodic reconciles; A's container is not B's orphan.
	b.kill()
	restarted := time.Now()
	b.start()
	// Wait for a periodic reconcile after the boot one (readyz says when
	// the last one ended).
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		var ready struct {
			LastReconcile time.Time `json:"last_reconcile"`
		}
		b.api("GET", "/v1/readyz", nil, &ready)
		return ready.LastReconcile.After(restarted.Add(time.Second)), "last reconcile " + ready.LastReconcile.String()
	})
	if strings.Contains(b.log.String(), x) {
		t.Fatalf("B's log mentions A's sandbox (orphan?):\n%s", tail(b.log.String()))
	}
	cidAfter, volAfter, _ := objectIDs(t, cli, x)
	if cidAfter != cidBefore || volAfter != volBefore {
		t.Fatalf("A's objects changed: container %s → %s, volume %s → %s", cidBefore, cidAfter, volBefore, volAfter)
	}
	if s := dockerStates(t, cli, []string{x})[x]; s != "running" {
		t.Fatalf("A's container is %s, want running", s)
	}
	// A still serves its own file from its own volume.
	if code, body := a.previewDo("GET", x, "/files/owner.txt", nil); code != 200 || body != "gateway A" {
		t.Fatalf("A's file through A: %d %q", code, body)
	}
	if a.list()[x] != "running" {
		t.Fatalf("A's record: %v", a.list())
	}

	// An unlabelled container and volume under a sandbox's names (made by
	// hand, or by another tool) are never removed, reused or mounted.
	y := testenv.UniqueID("y")
	ctx := context.Background()
	if _, err := cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: "s-" + y + "-data", Labels: testenv.Labels()}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "s-" + y, Config: &container.Config{Image: image, Labels: testenv.Labels()}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cli.ContainerRemove(context.Background(), "s-"+y, client.ContainerRemoveOptions{Force: true})
		cli.VolumeRemove(context.Background(), "s-"+y+"-data", client.VolumeRemoveOptions{Force: true})
	})
	cidY, volY, _ := objectIDs(t, cli, y)
	if code, body := a.api("POST", "/v1/sandboxes/"+y+"/purge", nil, nil); code != 404 {
		t.Fatalf("purge of an unlabelled container's id: %d %s; want 404", code, body)
	}
	code, body = a.api("POST", "/v1/sandboxes", map[string]any{"id": y, "image": image, "ports": []int{8080}}, nil)
	if code != 409 || !strings.Contains(body, "id_taken") {
		t.Fatalf("create over an unlabelled container: %d %s; want 409 id_taken", code, body)
	}
	// Only the volume under the name: still taken, still untouched.
	cli.ContainerRemove(ctx, "s-"+y, client.ContainerRemoveOptions{Force: true})
	code, body = a.api("POST", "/v1/sandboxes", map[string]any{"id": y, "image": image, "ports": []int{8080}}, nil)
	if code != 409 || !strings.Contains(body, "id_taken") || !strings.Contains(body, "volume") {
		t.Fatalf("create over an unlabelled volume: %d %s; want 409 id_taken naming the volume", code, body)
	}
	if _, vol, _ := objectIDs(t, cli, y); vol != volY || cidY == "" {
		t.Fatalf("the unlabelled volume changed: %q → %q", volY, vol)
	}
	if code, _ := a.api("GET", "/v1/sandboxes/"+y, nil, nil); code != 404 {
		t.Fatalf("a refused create left a record: %d", code)
	}

	// A's own purge still works on its own sandbox.
	if code, body := a.api("POST", "/v1/sandboxes/"+x+"/purge", nil, nil); code != 200 {
		t.Fatalf("A purging its own sandbox: %d %s", code, body)
	}
	if cid, vol, _ := objectIDs(t, cli, x); cid != "" || vol != "" {
		t.Fatalf("A's purge left container %q volume %q", cid, vol)
	}
}

// TestSandboxIsolation checks, by what Docker reports (no traffic to any
// container address), that a sandbox sits on sandwake's own bridge network
// with inter-container communication off, has NET_RAW dropped, a default
// memory limit, and its ports published on 127.0.0.1 only.
func TestSandboxIsolation(t *testing.T) {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	bin := buildCaddy(t)
	g := newGateway(t, bin, "default_memory 96MiB")
	g.start()
	id := testenv.UniqueID("i")
	// No memory_mb: the default applies.
	g.createSpec(cli, id, map[string]any{"image": image, "ports": []int{8080}})
	ctx := context.Background()
	res, err := cli.ContainerInspect(ctx, "s-"+id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ci := res.Container
	// Each instance has a sandbox network of its own.
	network := "sandwake-" + ci.Config.Labels["sandwake.instance"]
	if got := string(ci.HostConfig.NetworkMode); got != network {
		t.Errorf("network mode %q, want %q (not Docker's default bridge)", got, network)
	}
	if _, onDefault := ci.NetworkSettings.Networks["bridge"]; onDefault || len(ci.NetworkSettings.Networks) != 1 {
		t.Errorf("networks %v: want only %s", keys(ci.NetworkSettings.Networks), network)
	}
	if !containsFold(ci.HostConfig.CapDrop, "ALL") || containsFold(ci.HostConfig.CapAdd, "NET_RAW") || containsFold(ci.HostConfig.CapAdd, "MKNOD") {
		t.Errorf("CapDrop %v CapAdd %v: want ALL dropped and neither NET_RAW nor MKNOD given back", ci.HostConfig.CapDrop, ci.HostConfig.CapAdd)
	}
	if ci.HostConfig.Memory != 96<<20 || ci.HostConfig.MemorySwap != 96<<20 {
		t.Errorf("memory %d swap %d, want %d (default_memory)", ci.HostConfig.Memory, ci.HostConfig.MemorySwap, 96<<20)
	}
	if len(ci.NetworkSettings.Ports) == 0 {
		t.Errorf("no port published")
	}
	for port, bs := range ci.NetworkSettings.Ports {
		for _, b := range bs {
			if b.HostIP.String() != "127.0.0.1" {
				t.Errorf("port %s published on %s, want 127.0.0.1 only", port, b.HostIP)
			}
		}
	}
	nw, err := cli.NetworkInspect(ctx, network, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nw.Network.Driver != "bridge" || nw.Network.Options["com.docker.network.bridge.enable_icc"] != "false" {
		t.Errorf("network %s: driver %q options %v; want a bridge with enable_icc=false", network, nw.Network.Driver, nw.Network.Options)
	}
	if nw.Network.Labels["sandwake.managed"] != "true" {
		t.Errorf("network labels %v: want sandwake.managed", nw.Network.Labels)
	}
	// The sandbox still answers through its published port.
	if code, body := g.previewDo("GET", id, "/healthz", nil); code != 200 || body != "ok\n" {
		t.Fatalf("preview: %d %q", code, body)
	}

	// Specs Docker would refuse are 400 and leave nothing behind.
	for _, bad := range []map[string]any{
		{"memory_mb": 1 << 44},
		{"memory_mb": 99999999},
		{"cpus": 1000},
		{"workspace_path": "/proc"},
		{"image": "--help"},
		{"env": map[string]string{"A\nB": "x"}},
	} {
		bid := testenv.UniqueID("b")
		spec := map[string]any{"id": bid, "image": image, "ports": []int{8080}}
		for k, v := range bad {
			spec[k] = v
		}
		code, body := g.api("POST", "/v1/sandboxes", spec, nil)
		if code != 400 {
			t.Errorf("create with %v: %d %s; want 400", bad, code, body)
		}
		if cid, vol, _ := objectIDs(t, cli, bid); cid != "" || vol != "" {
			t.Errorf("create with %v left container %q volume %q", bad, cid, vol)
		}
		if code, _ := g.api("GET", "/v1/sandboxes/"+bid, nil, nil); code != 404 {
			t.Errorf("create with %v left a record", bad)
		}
	}
	// A missing image is 422 and leaves nothing either (pull never: no
	// registry is asked).
	g.kill()
	g.configure("pull never")
	g.start()
	mid := testenv.UniqueID("m")
	code, body := g.api("POST", "/v1/sandboxes", map[string]any{"id": mid, "image": "sandwake-missing-" + testenv.RunID() + ":1", "ports": []int{8080}}, nil)
	if code != 422 || !strings.Contains(body, "image_missing") {
		t.Errorf("missing image: %d %s; want 422 image_missing", code, body)
	}
	if cid, vol, _ := objectIDs(t, cli, mid); cid != "" || vol != "" {
		t.Errorf("missing image left container %q volume %q", cid, vol)
	}
	if code, _ := g.api("GET", "/v1/sandboxes/"+mid, nil, nil); code != 404 {
		t.Errorf("missing image left a record")
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(strings.TrimPrefix(strings.ToUpper(v), "CAP_"), s) {
			return true
		}
	}
	return false
}

// stop ends the gateway with SIGTERM and waits for it: a clean shutdown.
func (g *gateway) stop() {
	g.t.Helper()
	if g.cmd == nil || g.cmd.ProcessState != nil {
		return
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		g.cmd.Process.Kill()
		<-done
		g.t.Fatalf("caddy did not stop on SIGTERM:\n%s", tail(g.log.String()))
	}
}

// startFails starts the gateway and expects the process to exit with an
// error; it returns what the process printed.
func (g *gateway) startFails() string {
	g.t.Helper()
	g.launch()
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			g.t.Fatalf("caddy exited without an error:\n%s", g.log.String())
		}
	case <-time.After(60 * time.Second):
		g.cmd.Process.Kill()
		<-done
		g.t.Fatalf("caddy kept running on a store it should refuse:\n%s", tail(g.log.String()))
	}
	return g.log.String()
}

// TestDamagedOrLostStore: a damaged store refuses to start, naming the
// file, and removes nothing; a store that is new while the engine holds
// containers of its instance says so (log, readyz) and removes nothing.
func TestDamagedOrLostStore(t *testing.T) {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	bin := buildCaddy(t)
	instance := "lost" + testenv.RunID()
	g := newGateway(t, bin, "instance "+instance+"\n\t\torphans remove")
	g.start()
	id := testenv.UniqueID("d")
	g.create(cli, image, id, nil)
	cid, vol, _ := objectIDs(t, cli, id)
	// A clean stop: Badger writes its tables and MANIFEST on the way out,
	// as in the operator's "stop, then the file is damaged".
	g.stop()

	storeDir := filepath.Join(g.dir, "sandwake")
	if err := os.Truncate(filepath.Join(storeDir, "MANIFEST"), 10); err != nil {
		t.Fatal(err)
	}
	out := g.startFails()
	if !strings.Contains(out, filepath.Join(storeDir, "MANIFEST")) || !strings.Contains(out, "damaged") {
		t.Fatalf("the refusal does not name the damaged file:\n%s", tail(out))
	}
	if c, v, _ := objectIDs(t, cli, id); c != cid || v != vol {
		t.Fatalf("a refused start changed the sandbox: container %q → %q, volume %q → %q", cid, c, vol, v)
	}

	// The store is lost altogether (moved away): the gateway starts on a
	// new one, says so, and removes nothing, orphans remove or not.
	if err := os.RemoveAll(storeDir); err != nil {
		t.Fatal(err)
	}
	g.launch()
	var ready string
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		code, body := g.api("GET", "/v1/readyz", nil, nil)
		ready = body
		return code == 503 && strings.Contains(body, "is new") && strings.Contains(body, instance), fmt.Sprintf("readyz %d %s", code, body)
	})
	if !strings.Contains(ready, storeDir) {
		t.Fatalf("readyz does not name the store: %s", ready)
	}
	if !strings.Contains(g.log.String(), "store lost?") {
		t.Fatalf("no loud log line:\n%s", tail(g.log.String()))
	}
	if c, v, _ := objectIDs(t, cli, id); c != cid || v != vol {
		t.Fatalf("a new store removed the instance's sandbox: container %q → %q, volume %q → %q", cid, c, vol, v)
	}
}
