package main

import (
	"bufio"
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
	"syscall"
	"testing"
	"time"

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
// JSON the README shows, so the documentation cannot drift from the code.
func TestAdaptMatchesREADME(t *testing.T) {
	root := repoRoot(t)
	bin := buildCaddy(t)
	cmd := exec.Command(bin, "adapt", "--config", filepath.Join(root, "Caddyfile.example"), "--pretty")
	// The example's defaults, whatever this shell sets.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SANDWAKE_PREVIEW_PORT=") && !strings.HasPrefix(kv, "SANDWAKE_API_PORT=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("caddy adapt: %v\n%s", err, stderr.String())
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- adapt:begin -->\n```json\n", "```\n<!-- adapt:end -->"
	i, j := bytes.Index(readme, []byte(begin)), bytes.Index(readme, []byte(end))
	if i < 0 || j < i {
		t.Fatal("README.md has no adapt:begin/adapt:end JSON block")
	}
	want := readme[i+len(begin) : j]
	if !jsonEqual(t, got, want) {
		t.Fatalf("README's adapted JSON is stale; caddy adapt gives:\n%s", got)
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("adapt output: %v", err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("README JSON: %v", err)
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

// TestMakeRunFromFreshClone runs `make run` in a fresh clone of this
// repository's HEAD, waits for the printed preview URL and opens it: the
// demo sandbox answers. Then it stops the sandbox and checks that the URL
// wakes it again.
func TestMakeRunFromFreshClone(t *testing.T) {
	cli := testenv.Docker(t)
	root := repoRoot(t)
	clone := filepath.Join(t.TempDir(), "sandwake")
	if out, err := exec.Command("git", "clone", "-q", root, clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	demo := "demo" + testenv.RunID()
	previewPort, apiPort := freePort(t), freePort(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cli.ContainerRemove(ctx, "s-"+demo, client.ContainerRemoveOptions{Force: true})
		cli.VolumeRemove(ctx, "s-"+demo+"-data", client.VolumeRemoveOptions{Force: true})
		// make run imports the demo image; it imports it again each time.
		cli.ImageRemove(ctx, "sandwake-demo:latest", client.ImageRemoveOptions{Force: true})
	})

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "run")
	cmd.Dir = clone
	cmd.Env = append(os.Environ(),
		fmt.Sprintf("SANDWAKE_PREVIEW_PORT=%d", previewPort),
		fmt.Sprintf("SANDWAKE_API_PORT=%d", apiPort),
		"SANDWAKE_DEMO_ID="+demo,
		"SANDWAKE_API_TOKEN=make-run-test-token",
	)
	// Its own process group, so the whole tree (make, the script, caddy)
	// is stopped at the end.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		cmd.Wait()
	}()

	url := fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/", demo, previewPort)
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		seen := false
		for sc.Scan() {
			if strings.Contains(sc.Text(), url) {
				seen = true
				found <- true
			}
		}
		if !seen {
			found <- false
		}
	}()
	select {
	case ok := <-found:
		if !ok {
			t.Fatalf("make run ended without printing %s\nstderr:\n%s", url, tail(stderr.String()))
		}
	case <-ctx.Done():
		t.Fatalf("make run did not print %s in time\nstderr:\n%s", url, tail(stderr.String()))
	}

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
}

func tail(s string) string {
	if len(s) > 3000 {
		return s[len(s)-3000:]
	}
	return s
}
