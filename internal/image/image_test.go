package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// compose returns the Compose command: docker-compose (v1), else the
// docker compose plugin. Without either the test fails under
// SANDWAKE_REQUIRE_DOCKER=1 and skips otherwise.
func compose(t *testing.T) []string {
	t.Helper()
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}
	}
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if testenv.RequireDocker() {
		t.Fatal("neither docker-compose nor the docker compose plugin is installed (SANDWAKE_REQUIRE_DOCKER=1)")
	}
	t.Skip("neither docker-compose nor the docker compose plugin is installed")
	return nil
}

// socketGroup is the group id of the engine's Unix socket, what the
// compose file's DOCKER_GID asks for.
func socketGroup(t *testing.T) string {
	t.Helper()
	sock := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		if !strings.HasPrefix(h, "unix://") {
			t.Skipf("DOCKER_HOST=%s is not a Unix socket: the compose file mounts the engine's socket", h)
		}
		sock = strings.TrimPrefix(h, "unix://")
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatalf("the engine's socket: %v", err)
	}
	return strconv.FormatUint(uint64(fi.Sys().(*syscall.Stat_t).Gid), 10)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// mustRun runs a command in dir with env and returns its combined output,
// failing the test when it fails.
func mustRun(t *testing.T, ctx context.Context, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestMakeImageWakesDemoThroughCompose is the README's container path end
// to end: `make image` builds the gateway image (a second run imports
// nothing; the binary runs without NET_ADMIN too), deploy/compose.yaml
// runs it on the host's Docker (host network, NET_ADMIN, the socket's
// group), the gateway runs as the non-root user with CAP_NET_ADMIN
// effective and its egress firewall installed, the CLI in the container
// lists the demo sandbox created through the API, which, stopped, is woken
// by a request to its preview host; purge through the API removes it.
func TestMakeImageWakesDemoThroughCompose(t *testing.T) {
	cli := testenv.Docker(t)
	composeCmd := compose(t)
	gid := socketGroup(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	runID := testenv.RunID()
	tag := "sandwake-image-test:" + runID
	demoRepo := "sandwake-demo-test-" + runID
	project := "swimage" + runID
	id := testenv.UniqueID("demo")
	token := "image-test-" + runID
	previewPort, apiPort, adminPort := freePort(t), freePort(t), freePort(t)
	env := append(os.Environ(),
		"SANDWAKE_IMAGE="+tag,
		"SANDWAKE_API_TOKEN="+token,
		"DOCKER_GID="+gid,
		fmt.Sprintf("SANDWAKE_PREVIEW_PORT=%d", previewPort),
		fmt.Sprintf("SANDWAKE_API_PORT=%d", apiPort),
		fmt.Sprintf("CADDY_ADMIN=127.0.0.1:%d", adminPort),
		"SANDWAKE_DEMO_IMAGE="+demoRepo,
	)
	composeArgs := func(args ...string) []string {
		return append(append(composeCmd[1:], "-p", project, "-f", filepath.Join(root, "deploy", "compose.yaml")), args...)
	}

	logs := func() string {
		cmd := exec.Command(composeCmd[0], composeArgs("logs", "--no-color", "--tail", "60")...)
		cmd.Dir, cmd.Env = root, env
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	var instance string // the gateway's, once readyz told it
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if t.Failed() {
			t.Logf("the gateway's log:\n%s", logs())
		}
		// The gateway: compose's container and volume, then whatever of
		// them compose left.
		down := exec.CommandContext(ctx, composeCmd[0], composeArgs("down", "--volumes", "--timeout", "10")...)
		down.Dir, down.Env = root, env
		if out, err := down.CombinedOutput(); err != nil {
			t.Logf("compose down: %v\n%s", err, out)
		}
		byProject := make(client.Filters).Add("label", "com.docker.compose.project="+project)
		if cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: byProject}); err == nil {
			for _, c := range cs.Items {
				cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
			}
		}
		if vs, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: byProject}); err == nil {
			for _, v := range vs.Items {
				cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true})
			}
		}
		// The demo sandbox, and its gateway's network and firewall table.
		cli.ContainerRemove(ctx, "s-"+id, client.ContainerRemoveOptions{Force: true})
		cli.VolumeRemove(ctx, "s-"+id+"-data", client.VolumeRemoveOptions{Force: true})
		if instance != "" {
			byInstance := make(client.Filters).Add("label", "sandwake.instance="+instance)
			if cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: byInstance}); err == nil {
				for _, c := range cs.Items {
					cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
				}
			}
			if ns, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: byInstance}); err == nil {
				for _, n := range ns.Items {
					testenv.RemoveFirewall(n.Options)
					cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{})
				}
			}
		}
		// The images.
		cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{Force: true})
		if ims, err := cli.ImageList(ctx, client.ImageListOptions{All: true, Filters: make(client.Filters).Add("label", "sandwake.demo="+demoRepo)}); err == nil {
			for _, im := range ims.Items {
				cli.ImageRemove(ctx, im.ID, client.ImageRemoveOptions{Force: true})
			}
		}
	})

	// make image, twice: the second imports nothing.
	if out := mustRun(t, ctx, root, env, "make", "image", "IMAGE="+tag); !strings.Contains(out, "image "+tag+": imported") {
		t.Fatalf("make image did not import %s:\n%s", tag, out)
	}
	first, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, ctx, root, env, "make", "image", "IMAGE="+tag); !strings.Contains(out, "image "+tag+": up to date") {
		t.Errorf("make image again did not find %s up to date:\n%s", tag, out)
	}
	if again, err := cli.ImageInspect(ctx, tag); err != nil || again.ID != first.ID {
		t.Errorf("make image again: %s is %s (%v), was %s", tag, again.ID, err, first.ID)
	}
	if c := first.Config; c == nil || c.User != "65532:65532" || strings.Join(c.Entrypoint, " ") != "/usr/bin/caddy" || len(first.RootFS.Layers) != 1 {
		t.Errorf("image config %+v, %d layers: want user 65532:65532, entrypoint /usr/bin/caddy, one layer", first.Config, len(first.RootFS.Layers))
	}

	// Without NET_ADMIN the binary still runs (its file capability is
	// permitted, not effective, so the exec is not refused).
	if out := mustRun(t, ctx, root, env, "docker", "run", "--rm", "--label", testenv.LabelRun+"="+runID, tag, "version"); !strings.HasPrefix(out, "v2.") {
		t.Errorf("docker run %s version, without NET_ADMIN: %q, want Caddy's version", tag, out)
	}

	// The demo image, as make run makes it.
	mustRun(t, ctx, root, env, "go", "run", "./internal/demo")

	mustRun(t, ctx, root, env, composeCmd[0], composeArgs("up", "-d")...)
	api := func(method, path string, in, out any) (int, string) {
		var body io.Reader
		if in != nil {
			b, _ := json.Marshal(in)
			body = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(ctx, method, fmt.Sprintf("http://127.0.0.1:%d%s", apiPort, path), body)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := (&http.Client{Timeout: 90 * time.Second}).Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if out != nil {
			json.Unmarshal(b, out)
		}
		return resp.StatusCode, string(b)
	}

	var ready struct {
		Ready    bool              `json:"ready"`
		Instance string            `json:"instance"`
		Checks   map[string]string `json:"checks"`
	}
	testenv.Eventually(t, 90*time.Second, func() (bool, string) {
		code, body := api("GET", "/v1/readyz", nil, &ready)
		if ready.Instance != "" {
			instance = ready.Instance // for the cleanup, even when not ready
		}
		return code == 200 && ready.Ready, fmt.Sprintf("readyz %d %s", code, body)
	})
	if ready.Checks["egress"] != "ok" {
		t.Fatalf("readyz egress %q, want ok (enforced by a non-root gateway with NET_ADMIN)", ready.Checks["egress"])
	}

	// The gateway's process: the non-root user, the socket's group, and
	// CAP_NET_ADMIN (bit 12) effective.
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{Filters: make(client.Filters).Add("label", "com.docker.compose.project="+project)})
	if err != nil || len(cs.Items) != 1 {
		t.Fatalf("the compose project's containers: %d (%v), want 1", len(cs.Items), err)
	}
	ci, err := cli.ContainerInspect(ctx, cs.Items[0].ID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ci.Container.State.Pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	capEff, err := strconv.ParseUint(fields["CapEff"], 16, 64)
	if err != nil {
		t.Fatalf("CapEff %q: %v", fields["CapEff"], err)
	}
	if fields["Uid"] != "65532 65532 65532 65532" || !strings.Contains(" "+fields["Groups"]+" ", " "+gid+" ") || capEff&(1<<12) == 0 {
		t.Errorf("gateway process: Uid %q Groups %q CapEff %q, want uid 65532, group %s, CAP_NET_ADMIN effective", fields["Uid"], fields["Groups"], fields["CapEff"], gid)
	}

	// The demo sandbox, created through the API, then stopped.
	if code, body := api("POST", "/v1/sandboxes", map[string]any{"id": id, "image": demoRepo + ":latest", "ports": []int{8080}, "memory_mb": 64}, nil); code != 201 {
		t.Fatalf("create %s: %d %s", id, code, body)
	}
	// The CLI in the container finds the API and its token by itself.
	if out := mustRun(t, ctx, root, env, composeCmd[0], composeArgs("exec", "-T", "sandwake", "caddy", "sandwake", "ls")...); !strings.Contains(out, id) {
		t.Errorf("caddy sandwake ls in the container does not list %s:\n%s", id, out)
	}
	var rec struct {
		State string `json:"state"`
	}
	if code, body := api("POST", "/v1/sandboxes/"+id+"/stop", nil, &rec); code != 200 || rec.State != "stopped" {
		t.Fatalf("stop %s: %d %s", id, code, body)
	}
	if res, err := cli.ContainerInspect(ctx, "s-"+id, client.ContainerInspectOptions{}); err != nil || res.Container.State.Running {
		t.Fatalf("the stopped demo's container: %v, running %v", err, err == nil && res.Container.State.Running)
	}
	// Its sandbox network carries the gateway's firewall table.
	if os.Geteuid() == 0 {
		nw, err := cli.NetworkInspect(ctx, "sandwake-"+instance, client.NetworkInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		table := "sandwake-" + nw.Network.Options["com.docker.network.bridge.name"]
		if out, err := exec.CommandContext(ctx, "nft", "list", "table", "inet", table).CombinedOutput(); err != nil {
			t.Errorf("nft list table inet %s: %v\n%s", table, err, out)
		}
	}

	// A request to its preview host wakes it and gets the app's answer.
	preview := &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", previewPort))
		},
	}}
	resp, err := preview.Get(fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/", id, previewPort))
	if err != nil {
		t.Fatalf("preview: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "Hello from the sandbox") || !strings.Contains(string(body), "s-"+id) {
		t.Fatalf("preview of the stopped demo: %d %q, want 200 and the app's page for s-%s", resp.StatusCode, body, id)
	}
	if code, body := api("GET", "/v1/sandboxes/"+id, nil, &rec); code != 200 || rec.State != "running" {
		t.Errorf("after the preview request: %d %s, want running", code, body)
	}
	if res, err := cli.ContainerInspect(ctx, "s-"+id, client.ContainerInspectOptions{}); err != nil || !res.Container.State.Running {
		t.Errorf("the woken demo's container: %v, want running", err)
	}

	// Purge through the API removes the container and its volume.
	if code, body := api("POST", "/v1/sandboxes/"+id+"/purge", nil, nil); code != 200 {
		t.Fatalf("purge %s: %d %s", id, code, body)
	}
	if _, err := cli.ContainerInspect(ctx, "s-"+id, client.ContainerInspectOptions{}); err == nil {
		t.Errorf("purge left the container s-%s", id)
	}
	if _, err := cli.VolumeInspect(ctx, "s-"+id+"-data", client.VolumeInspectOptions{}); err == nil {
		t.Errorf("purge left the volume s-%s-data", id)
	}
}
