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
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/image"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// repoRoot is the module root (tests run in cmd/caddy).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func buildCaddy(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "caddy")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("building caddy: %v\n%s", err, out)
	}
	return bin
}

// TestAdaptMatchesREADME: `caddy adapt --config Caddyfile.example` gives the
// JSON docs/caddyfile.md shows, so the documentation cannot drift from the
// code.
func TestAdaptMatchesREADME(t *testing.T) {
	root := repoRoot(t)
	bin := buildCaddy(t)
	cmd := exec.Command(bin, "adapt", "--config", filepath.Join(root, "Caddyfile.example"), "--pretty")
	// The example's defaults, whatever this shell sets.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SANDWAKE_PREVIEW_PORT=") && !strings.HasPrefix(kv, "SANDWAKE_API_PORT=") && !strings.HasPrefix(kv, "SANDWAKE_EGRESS=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("caddy adapt: %v\n%s", err, stderr.String())
	}
	readme, err := os.ReadFile(filepath.Join(root, "docs", "caddyfile.md"))
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- adapt:begin -->\n```json\n", "```\n<!-- adapt:end -->"
	i, j := bytes.Index(readme, []byte(begin)), bytes.Index(readme, []byte(end))
	if i < 0 || j < i {
		t.Fatal("docs/caddyfile.md has no adapt:begin/adapt:end JSON block")
	}
	want := readme[i+len(begin) : j]
	if !jsonEqual(t, got, want) {
		t.Fatalf("docs/caddyfile.md's adapted JSON is stale; caddy adapt gives:\n%s", got)
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("adapt output: %v", err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("docs/caddyfile.md JSON: %v", err)
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
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

// TestMakeRunFromFreshClone runs `make run` on a terminal in a fresh clone
// of this repository's HEAD, waits for the printed preview URL and opens it:
// the demo sandbox answers. Then it stops the sandbox and checks that the URL
// wakes it again. Ctrl-C stops the gateway and make exits with status 0. A
// second `make run` imports nothing: the one demo image stays, none is left
// dangling; Ctrl-C ends it cleanly too.
func TestMakeRunFromFreshClone(t *testing.T) {
	cli := testenv.Docker(t)
	root := repoRoot(t)
	clone := filepath.Join(t.TempDir(), "sandwake")
	if out, err := exec.Command("git", "clone", "-q", root, clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	// Names of this run: the demo sandbox, and the demo image's repository
	// (SANDWAKE_DEMO_IMAGE), so a developer's own demo is not touched.
	demo := "demo" + testenv.RunID()
	repo := "sandwake-demo-test-" + testenv.RunID()
	previewPort, apiPort := freePort(t), freePort(t)
	demoImages := func() []image.Summary {
		t.Helper()
		res, err := cli.ImageList(context.Background(), client.ImageListOptions{All: true, Filters: make(client.Filters).Add("label", "sandwake.demo="+repo)})
		if err != nil {
			t.Fatal(err)
		}
		return res.Items
	}
	// make run's gateway (a new instance: the clone's store is new) makes
	// its own sandbox network, sandwake-<instance>, and firewall table;
	// both go with the demo sandbox.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if ci, err := cli.ContainerInspect(ctx, "s-"+demo, client.ContainerInspectOptions{}); err == nil && ci.Container.Config != nil {
			network := "sandwake-" + ci.Container.Config.Labels["sandwake.instance"]
			cli.ContainerRemove(ctx, "s-"+demo, client.ContainerRemoveOptions{Force: true})
			if nw, err := cli.NetworkInspect(ctx, network, client.NetworkInspectOptions{}); err == nil {
				testenv.RemoveFirewall(nw.Network.Options)
				cli.NetworkRemove(ctx, nw.Network.ID, client.NetworkRemoveOptions{})
			}
		}
		cli.VolumeRemove(ctx, "s-"+demo+"-data", client.VolumeRemoveOptions{Force: true})
		for _, im := range demoImages() {
			cli.ImageRemove(ctx, im.ID, client.ImageRemoveOptions{Force: true})
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	env := append(os.Environ(),
		fmt.Sprintf("SANDWAKE_PREVIEW_PORT=%d", previewPort),
		fmt.Sprintf("SANDWAKE_API_PORT=%d", apiPort),
		"SANDWAKE_DEMO_ID="+demo,
		"SANDWAKE_DEMO_IMAGE="+repo,
		"SANDWAKE_API_TOKEN=make-run-test-token",
	)
	url := fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/", demo, previewPort)
	httpc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", previewPort))
		},
	}}
	get := func(path string) (int, string) {
		resp, err := httpc.Get(strings.TrimSuffix(url, "/") + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// interrupt types Ctrl-C once the banner is out and checks the end:
	// status 0, a short message, no make error, the gateway gone.
	interrupt := func(run *terminalRun, which string) {
		t.Helper()
		run.waitForegroundHandedOver(t, time.Minute)
		if status := run.ctrlC(t, ctx); status != 0 {
			t.Fatalf("%s make run: exit status %d after Ctrl-C, want 0; output:\n%s", which, status, tail(run.output()))
		}
		out := run.output()
		if !strings.Contains(out, "sandwake stopped.") || strings.Contains(out, "make: ***") {
			t.Errorf("%s make run: end of output after Ctrl-C, want \"sandwake stopped.\" and no make error:\n%s", which, tail(out))
		}
		for _, port := range []int{apiPort, previewPort} {
			if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second); err == nil {
				c.Close()
				t.Errorf("%s make run: port %d still accepts connections after Ctrl-C: the gateway was not stopped", which, port)
			}
		}
	}

	first := startOnTerminal(t, clone, env, "make", "run")
	first.waitFor(t, 8*time.Minute, url)
	for _, want := range []string{
		fmt.Sprintf("Dashboard:      http://localhost:%d/   (sign in with the token in data/api-token)", apiPort),
		fmt.Sprintf("export SANDWAKE_API=http://localhost:%d SANDWAKE_API_TOKEN=$(cat data/api-token)", apiPort),
		"bin/caddy sandwake ls",
		"bin/caddy sandwake wake " + demo,
	} {
		if !strings.Contains(first.output(), want) {
			t.Errorf("banner lacks %q", want)
		}
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("demo sandbox: %d %q", code, body)
	}
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://127.0.0.1:%d/v1/sandboxes/%s/stop", apiPort, demo), nil)
	req.Host = fmt.Sprintf("localhost:%d", apiPort)
	req.Header.Set("Authorization", "Bearer make-run-test-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stopping the demo: %v %v", err, resp)
	}
	resp.Body.Close()
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("demo sandbox after stop (held through the wake): %d %q", code, body)
	}
	// The API answers on 127.0.0.1 as on localhost; any other Host on its
	// port is told where the API is (not an empty 200).
	for host, want := range map[string]int{fmt.Sprintf("127.0.0.1:%d", apiPort): 200, fmt.Sprintf("localhost:%d", apiPort): 200, "example.test": 421} {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/v1/sandboxes", apiPort), nil)
		req.Host = host
		req.Header.Set("Authorization", "Bearer make-run-test-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == 200 && !strings.Contains(string(b), demo)) || (want == 421 && !strings.Contains(string(b), "http://localhost:")) {
			t.Errorf("GET /v1/sandboxes with Host %s: %d %.200q, want %d", host, resp.StatusCode, b, want)
		}
	}
	imgs := demoImages()
	if len(imgs) != 1 || len(imgs[0].RepoTags) == 0 {
		t.Fatalf("after the first make run: demo images %+v, want one, tagged", imgs)
	}
	imported := imgs[0].ID
	interrupt(first, "first")

	// The obvious reset: the store goes, the demo's container stays under
	// the first run's instance; make run removes it and starts again.
	if err := os.RemoveAll(filepath.Join(clone, "data")); err != nil {
		t.Fatal(err)
	}
	second := startOnTerminal(t, clone, env, "make", "run")
	second.waitFor(t, 8*time.Minute, url)
	if want := "removing the demo sandbox an earlier run left"; !strings.Contains(second.output(), want) {
		t.Errorf("make run after rm -rf data did not say %q:\n%s", want, tail(second.output()))
	}
	if want := "demo image " + repo + ":latest: up to date"; !strings.Contains(second.output(), want) {
		t.Errorf("second make run did not say %q:\n%s", want, tail(second.output()))
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("demo sandbox on the second run: %d %q", code, body)
	}
	imgs = demoImages()
	if len(imgs) != 1 || imgs[0].ID != imported || len(imgs[0].RepoTags) == 0 {
		t.Fatalf("after the second make run: demo images %+v, want only the first one (%s), tagged", imgs, imported)
	}
	interrupt(second, "second")

	// A port in use is named with the variable that moves it.
	busy, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", previewPort))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "make", "run")
	cmd.Dir, cmd.Env = clone, env
	out, err := cmd.CombinedOutput()
	busy.Close()
	if err == nil || !strings.Contains(string(out), fmt.Sprintf("port %d is in use: set SANDWAKE_PREVIEW_PORT", previewPort)) {
		t.Errorf("make run with the preview port taken: %v, output:\n%s\nwant it to name SANDWAKE_PREVIEW_PORT", err, tail(string(out)))
	}

	// make clean-demo removes exactly what make run made.
	cmd = exec.CommandContext(ctx, "make", "clean-demo")
	cmd.Dir, cmd.Env = clone, env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make clean-demo: %v\n%s", err, out)
	}
	if _, err := cli.ContainerInspect(context.Background(), "s-"+demo, client.ContainerInspectOptions{}); err == nil {
		t.Error("make clean-demo left the demo container")
	}
	if _, err := cli.VolumeInspect(context.Background(), "s-"+demo+"-data", client.VolumeInspectOptions{}); err == nil {
		t.Error("make clean-demo left the demo volume")
	}
	if imgs := demoImages(); len(imgs) != 0 {
		t.Errorf("make clean-demo left demo images %+v", imgs)
	}
	if _, err := os.Stat(filepath.Join(clone, "data")); !os.IsNotExist(err) {
		t.Errorf("make clean-demo left data/: %v", err)
	}
}

func tail(s string) string {
	if len(s) > 3000 {
		return s[len(s)-3000:]
	}
	return s
}
