package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/webhook"
)

// gateway is the built Caddy running as its own process, killable with
// SIGKILL and restartable on the same store.
type gateway struct {
	t           *testing.T
	bin, dir    string
	previewPort int
	apiPort     int
	cmd         *exec.Cmd
	log         *syncBuffer
	instance    string // as readyz told it, for the cleanup of its network
	// tokens are more tokens of the API (token blocks), beside crashToken.
	tokens string
}

const crashToken = "crash-test-token"

// syncBuffer is a bytes.Buffer that the process's output copier writes
// while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newGateway(t *testing.T, bin, extra string) *gateway {
	g := &gateway{t: t, bin: bin, dir: t.TempDir(), previewPort: freePort(t), apiPort: freePort(t)}
	g.configure(extra)
	t.Cleanup(func() {
		g.kill()
		if t.Failed() && g.log != nil {
			// What went wrong in the gateway is in its warnings and
			// errors (a test's failure message cannot carry them all).
			var lines []string
			for l := range strings.SplitSeq(g.log.String(), "\n") {
				if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
					lines = append(lines, l)
				}
			}
			t.Logf("gateway %s (API 127.0.0.1:%d): its last warnings and errors:\n%s", g.instance, g.apiPort, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
		// Each instance has a sandbox network of its own: removed with
		// the gateway, not left for the end of the run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if cli, err := client.New(client.FromEnv); err == nil {
			testenv.RemoveInstance(ctx, cli, g.instance)
			cli.Close()
		}
	})
	return g
}

// configure writes the gateway's Caddyfile with extra sandwake options; it
// takes effect at the next start.
func (g *gateway) configure(extra string) {
	cfg := fmt.Sprintf(`{
	admin off
	persist_config off
	storage file_system %s
	sandwake {
		storage %s
		label %s %s
		stop_timeout 2s
		%s
	}
}
http://*.preview.localhost:%d {
	bind 127.0.0.1
	sandwake_preview
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	handle /metrics {
		metrics
	}
	sandwake_api {
		token %s
		%s
	}
}
`, filepath.Join(g.dir, "caddy"), filepath.Join(g.dir, "sandwake"), testenv.LabelRun, testenv.RunID(), extra,
		g.previewPort, g.apiPort, crashToken, g.tokens)
	if err := os.WriteFile(filepath.Join(g.dir, "Caddyfile"), []byte(cfg), 0o600); err != nil {
		g.t.Fatal(err)
	}
}

func (g *gateway) start() {
	g.t.Helper()
	g.launch()
	// A bound, not a timing goal: under the race detector with every
	// package testing at once on two cores, a node joining its cluster
	// has taken more than 30 s to listen.
	testenv.Eventually(g.t, 90*time.Second, func() (bool, string) {
		if g.cmd.ProcessState != nil {
			return false, "caddy exited: " + g.log.String()
		}
		var ready struct {
			Instance string `json:"instance"`
		}
		code, _ := g.api("GET", "/v1/readyz", nil, &ready)
		if code == 200 {
			g.instance = ready.Instance
			return true, ""
		}
		// The last message is the failure's: it carries the gateway's log,
		// which tells where its start stood.
		log := g.log.String()
		return false, fmt.Sprintf("readyz %d; the gateway's log so far (tail):\n%s", code, log[max(0, len(log)-6000):])
	})
}

// launch starts the gateway's process, its output into g.log, and returns
// without waiting for it to be ready.
func (g *gateway) launch() {
	g.t.Helper()
	g.log = new(syncBuffer)
	g.cmd = exec.Command(g.bin, "run", "--config", filepath.Join(g.dir, "Caddyfile"), "--adapter", "caddyfile")
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	g.cmd.Env = append(os.Environ(), "HOME="+g.dir, "XDG_DATA_HOME="+g.dir, "XDG_CONFIG_HOME="+g.dir)
	if err := g.cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
}

// kill ends the gateway with SIGKILL: no Stop, no Cleanup, no flush.
func (g *gateway) kill() {
	if g.cmd != nil && g.cmd.Process != nil && g.cmd.ProcessState == nil {
		g.cmd.Process.Signal(syscall.SIGKILL)
		g.cmd.Wait()
	}
}

func (g *gateway) api(method, path string, body, out any) (int, string) {
	return g.apiAs(crashToken, method, path, body, out)
}

// metric is the value of an unlabelled metric on the gateway's /metrics
// (Caddy's metrics handler on its API site); the test fails when it is not
// there.
func (g *gateway) metric(name string) float64 {
	g.t.Helper()
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", g.apiPort))
	if err != nil {
		g.t.Fatalf("reading the metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				g.t.Fatalf("metric %s: %q", name, line)
			}
			return f
		}
	}
	g.t.Fatalf("no metric %s on /metrics (%d, %d bytes)", name, resp.StatusCode, len(b))
	return 0
}

// apiAs is api with another token.
func (g *gateway) apiAs(token, method, path string, body, out any) (int, string) {
	code, text, _ := g.apiDo(token, method, path, body, out)
	return code, text
}

// apiDo is apiAs that also returns the answer's header.
func (g *gateway) apiDo(token, method, path string, body, out any) (int, string, http.Header) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, fmt.Sprintf("http://127.0.0.1:%d%s", g.apiPort, path), rd)
	req.Header.Set("Authorization", "Bearer "+token)
	c := http.Client{Timeout: 90 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error(), nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		json.Unmarshal(b, out)
	}
	return resp.StatusCode, string(b), resp.Header
}

type sandboxView struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

func (g *gateway) list() map[string]string {
	g.t.Helper()
	var out struct{ Sandboxes []sandboxView }
	if code, body := g.api("GET", "/v1/sandboxes", nil, &out); code != 200 {
		g.t.Fatalf("list: %d %s", code, body)
	}
	m := map[string]string{}
	for _, s := range out.Sandboxes {
		m[s.ID] = s.State
	}
	return m
}

// dockerStates reads what Docker shows for each sandbox id.
func dockerStates(t *testing.T, cli *client.Client, ids []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, id := range ids {
		res, err := cli.ContainerInspect(context.Background(), "s-"+id, client.ContainerInspectOptions{})
		if err != nil {
			out[id] = "missing"
			continue
		}
		out[id] = string(res.Container.State.Status)
	}
	return out
}

// agrees reports whether a record state matches what Docker shows.
func agrees(state, docker string) bool {
	switch state {
	case "running":
		return docker == "running"
	case "paused":
		return docker == "paused"
	case "stopped":
		return docker == "exited" || docker == "created"
	case "killed", "expired", "error":
		return docker != "running" && docker != "paused"
	}
	return false // creating (or unknown) after a restart is a stuck record
}

func (g *gateway) create(cli *client.Client, image, id string, env map[string]string) {
	g.t.Helper()
	g.createSpec(cli, id, map[string]any{"image": image, "ports": []int{8080}, "memory_mb": 32, "env": env})
}

// previewClient sends every request to the gateway's preview listener on
// loopback, whatever the host name.
func (g *gateway) previewClient() *http.Client {
	return &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", g.previewPort))
		},
	}}
}

func (g *gateway) previewGet(id string) (*http.Response, error) {
	return g.previewClient().Get(fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/healthz", id, g.previewPort))
}

// TestCrashRecovery kills the built Caddy with SIGKILL in the middle of a
// wake and in the middle of a reaper pass, restarts it on the same store, and
// checks that the store converges to what Docker shows: no record lost, none
// left in a transitional state, every state agreeing with its container.
func TestCrashRecovery(t *testing.T) {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	bin := buildCaddy(t)

	t.Run("mid-wake", func(t *testing.T) {
		g := newGateway(t, bin, "")
		g.start()
		// The start-up log says which upstream mode is in force and why.
		if log := g.log.String(); !strings.Contains(log, `"msg":"upstream mode: direct"`) || !strings.Contains(log, "is on this host") {
			t.Errorf("the start-up log does not say upstream mode direct and why:\n%s", log[max(0, len(log)-4000):])
		}
		slow := testenv.UniqueID("w")
		g.create(cli, image, slow, map[string]string{"STARTUP_DELAY": "3s"})
		if code, body := g.api("POST", "/v1/sandboxes/"+slow+"/stop", nil, nil); code != 200 {
			t.Fatalf("stop: %d %s", code, body)
		}
		// A request starts the wake; the app takes 3s to listen, so the
		// wake is in its readiness poll when Docker reports the start.
		go func() {
			if resp, err := g.previewGet(slow); err == nil {
				resp.Body.Close()
			}
		}()
		testenv.Eventually(t, 30*time.Second, func() (bool, string) {
			s := dockerStates(t, cli, []string{slow})[slow]
			return s == "running", "docker: " + s
		})
		before := g.list()
		if before[slow] != "stopped" {
			t.Fatalf("record is %s mid-wake, want stopped (wake not finished)", before[slow])
		}
		g.kill()

		// The container was started, its app not yet listening: the store
		// must converge on running once the app answers (the periodic
		// reconcile, made frequent here, adopts it).
		g.configure("reconcile_interval 500ms")
		g.start()
		after := g.list()
		if len(after) != len(before) {
			t.Fatalf("records after restart: %v, before: %v", after, before)
		}
		testenv.Eventually(t, 30*time.Second, func() (bool, string) {
			state := g.list()[slow]
			ds := dockerStates(t, cli, []string{slow})[slow]
			return state == "running" && agrees(state, ds), fmt.Sprintf("record %s, docker %s", state, ds)
		})
		resp, err := g.previewGet(slow)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("after restart: %v %v", err, resp)
		}
		resp.Body.Close()
	})

	t.Run("mid-create", func(t *testing.T) {
		g := newGateway(t, bin, "")
		g.start()
		id := testenv.UniqueID("c")
		t.Cleanup(func() {
			cli.ContainerRemove(context.Background(), "s-"+id, client.ContainerRemoveOptions{Force: true})
			cli.VolumeRemove(context.Background(), "s-"+id+"-data", client.VolumeRemoveOptions{Force: true})
		})
		go g.api("POST", "/v1/sandboxes", map[string]any{"id": id, "image": image, "ports": []int{8080}, "env": map[string]string{"STARTUP_DELAY": "5s"}}, nil)
		testenv.Eventually(t, 30*time.Second, func() (bool, string) {
			s := dockerStates(t, cli, []string{id})[id]
			return s == "running", "docker: " + s
		})
		g.kill()
		g.start()
		after := g.list()
		if after[id] != "error" {
			t.Fatalf("a create cut by a crash is %q after restart, want error (not stuck creating)", after[id])
		}
		// And it can be woken (recreated) from there.
		if code, body := g.api("POST", "/v1/sandboxes/"+id+"/wake", nil, nil); code != 200 || !strings.Contains(body, `"running"`) {
			t.Fatalf("wake after crash: %d %s", code, body)
		}
	})

	t.Run("mid-reaper", func(t *testing.T) {
		g := newGateway(t, bin, "idle_pause 1s\n\t\tidle_stop 3s\n\t\treap_interval 200ms\n\t\tactivity_flush 100ms")
		g.start()
		var ids []string
		for range 4 {
			id := testenv.UniqueID("r")
			ids = append(ids, id)
			g.create(cli, image, id, nil)
		}
		// Kill as soon as Docker shows the reaper at work (a pause or a
		// stop), while it still has sandboxes to go.
		testenv.Eventually(t, 60*time.Second, func() (bool, string) {
			ds := dockerStates(t, cli, ids)
			for _, s := range ds {
				if s == "paused" || s == "exited" {
					return true, ""
				}
			}
			return false, fmt.Sprint(ds)
		})
		before := g.list()
		g.kill()
		// Restarted without idle tiers, so that nothing moves while the
		// store is compared with Docker.
		g.configure("idle_pause 0\n\t\tidle_stop 0")
		g.start()
		after := g.list()
		if len(after) != len(before) {
			t.Fatalf("records after restart: %v, before: %v", after, before)
		}
		ds := dockerStates(t, cli, ids)
		for _, id := range ids {
			if !agrees(after[id], ds[id]) {
				t.Errorf("%s: record %s, docker %s", id, after[id], ds[id])
			}
		}
	})

	t.Run("pending-webhooks", func(t *testing.T) {
		var (
			mu       sync.Mutex
			failing  = true
			attempts int
			accepted []string // event types of accepted deliveries, deduplicated by delivery id
			seen     = map[string]bool{}
		)
		recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			defer mu.Unlock()
			attempts++
			if failing {
				http.Error(w, "down", http.StatusInternalServerError)
				return
			}
			if err := webhook.Verify([]byte("crash-secret"), r.Header.Get(webhook.HeaderSignature), body, time.Minute); err != nil {
				http.Error(w, err.Error(), http.StatusUnauthorized)
				return
			}
			id := r.Header.Get(webhook.HeaderDelivery)
			if !seen[id] {
				seen[id] = true
				var ev struct{ Type string }
				json.Unmarshal(body, &ev)
				accepted = append(accepted, ev.Type)
			}
		}))
		defer recv.Close()
		g := newGateway(t, bin, fmt.Sprintf("webhook %s {\n\t\t\tsecret crash-secret\n\t\t\tretry_min 100ms\n\t\t}", recv.URL))
		g.start()
		id := testenv.UniqueID("h")
		g.create(cli, image, id, nil)
		if code, body := g.api("POST", "/v1/sandboxes/"+id+"/stop", nil, nil); code != 200 {
			t.Fatalf("stop: %d %s", code, body)
		}
		testenv.Eventually(t, 30*time.Second, func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			return attempts >= 2, fmt.Sprintf("%d attempts", attempts)
		})
		g.kill() // deliveries pending in the outbox
		mu.Lock()
		failing = false
		mu.Unlock()
		g.start()
		want := "sandbox.creating sandbox.running sandbox.stopped"
		testenv.Eventually(t, 60*time.Second, func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			got := strings.Join(accepted, " ")
			return got == want, got
		})
	})
}
