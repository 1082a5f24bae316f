package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/moby/moby/client"

	swclient "github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const testToken = "test-token-0123456789"

// harness is a real Caddy, in this process, serving sandwake on loopback
// ports of its own, with its store in a temporary directory and every
// container it makes labelled for cleanup.
type harness struct {
	t           testing.TB
	cli         *client.Client
	image       string
	previewPort int
	apiPort     int
	dir         string
	extra       string // extra lines for the sandwake global option
	client      *http.Client
}

// caddyMu serialises in-process Caddy instances: Caddy keeps one running
// config per process.
var caddyMu sync.Mutex

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func newHarness(t testing.TB, extra string) *harness {
	t.Helper()
	h := newHarnessWithCaddyfile(t, func(h *harness) string { return h.caddyfile(extra) })
	h.extra = extra
	return h
}

// newHarnessWithCaddyfile starts a harness whose Caddyfile render returns,
// once the harness's ports and directory are known.
func newHarnessWithCaddyfile(t testing.TB, render func(h *harness) string) *harness {
	t.Helper()
	h := &harness{
		t:           t,
		cli:         testenv.Docker(t),
		image:       testenv.TestAppImage(t),
		previewPort: freePort(t),
		apiPort:     freePort(t),
		dir:         t.TempDir(),
	}
	// Every preview host is dialled on loopback, whatever its name.
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	h.client = &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", h.previewPort))
			},
			MaxIdleConnsPerHost: 64,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	caddyMu.Lock()
	var instance string
	t.Cleanup(func() {
		caddy.Stop()
		caddyMu.Unlock()
		// Once the gateway is gone (its reconcile would make the network
		// again): each instance has a network of its own.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		testenv.RemoveInstance(ctx, h.cli, instance)
	})
	h.loadText(render(h))
	h.waitReady()
	instance = h.instance()
	return h
}

// caddyfile renders the harness's Caddyfile with extra global options.
func (h *harness) caddyfile(extra string) string {
	return fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	storage file_system %s
	sandwake {
		storage %s
		preview_url http://*.preview.localhost:%d
		label %s %s
		stop_timeout 5s
		%s
	}
}
http://*.preview.localhost:%d {
	bind 127.0.0.1
	sandwake_preview
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	sandwake_api {
		token %s
	}
}
`, filepath.Join(h.dir, "caddy"), filepath.Join(h.dir, "sandwake"), h.previewPort,
		testenv.LabelRun, testenv.RunID(), extra, h.previewPort, h.apiPort, testToken)
}

// load adapts the harness's Caddyfile with extra global options and loads
// it: the first call starts Caddy, later calls are config reloads.
func (h *harness) load(extra string) { h.loadText(h.caddyfile(extra)) }

// loadText adapts a Caddyfile and loads it.
func (h *harness) loadText(caddyfile string) {
	h.t.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		h.t.Fatalf("adapting Caddyfile: %v", err)
	}
	for _, w := range warnings {
		h.t.Logf("caddyfile warning: %s", w.String())
	}
	if err := caddy.Load(cfg, true); err != nil {
		h.t.Fatalf("loading config: %v", err)
	}
}

func (h *harness) waitReady() {
	testenv.Eventually(h.t, 20*time.Second, func() (bool, string) {
		resp, err := http.Get(h.apiURL("/v1/readyz"))
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
}

func (h *harness) apiURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", h.apiPort, path)
}

// api calls the management API and decodes a JSON answer into out (if not
// nil); it returns the status.
func (h *harness) api(method, path string, body any, out any) int {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.apiURL(path), rd)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			h.t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

// create makes a running sandbox through the API and registers its removal.
func (h *harness) create(extraEnv map[string]string) swclient.Sandbox {
	h.t.Helper()
	id := testenv.UniqueID("g")
	h.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h.cli.ContainerRemove(ctx, docker.ContainerName(id), client.ContainerRemoveOptions{Force: true})
		h.cli.VolumeRemove(ctx, docker.VolumeName(id), client.VolumeRemoveOptions{Force: true})
	})
	var rec swclient.Sandbox
	status := h.api("POST", "/v1/sandboxes", map[string]any{"id": id, "image": h.image, "ports": []int{8080}, "env": extraEnv}, &rec)
	if status != http.StatusCreated || rec.State != string(lifecycle.Running) {
		h.t.Fatalf("create: %d %+v", status, rec)
	}
	return rec
}

func (h *harness) stop(id string) {
	h.t.Helper()
	var rec swclient.Sandbox
	if status := h.api("POST", "/v1/sandboxes/"+id+"/stop", nil, &rec); status != 200 || rec.State != "stopped" {
		h.t.Fatalf("stop: %d %+v", status, rec)
	}
}

func (h *harness) state(id string) string {
	h.t.Helper()
	var rec swclient.Sandbox
	h.api("GET", "/v1/sandboxes/"+id, nil, &rec)
	return rec.State
}

// host is the preview host of a sandbox's port.
func (h *harness) host(id string, port int) string {
	return fmt.Sprintf("s-%s-%d.preview.localhost:%d", id, port, h.previewPort)
}

// preview sends a request to a preview host (dialled on loopback).
func (h *harness) preview(method, host, path string, body io.Reader, header http.Header) (*http.Response, string) {
	h.t.Helper()
	resp, b, err := h.previewErr(method, host, path, body, header)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp, b
}

// previewErr is preview for goroutines other than the test's: it returns
// the error instead of failing the test.
func (h *harness) previewErr(method, host, path string, body io.Reader, header http.Header) (*http.Response, string, error) {
	req, err := http.NewRequest(method, "http://"+host+path, body)
	if err != nil {
		return nil, "", err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("%s %s%s: %w", method, host, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// browserHeader is what a browser sends for a page load.
func browserHeader() http.Header {
	return http.Header{
		"Accept":         {"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"},
		"Sec-Fetch-Mode": {"navigate"},
		"Sec-Fetch-Dest": {"document"},
	}
}

// startEvents counts "start" events of a container on the engine between
// since and now: the engine's own count, independent of sandwake.
func (h *harness) startEvents(id string, since time.Time) int {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := client.Filters{}.Add("container", docker.ContainerName(id)).Add("event", "start").Add("type", "container")
	res := h.cli.Events(ctx, client.EventsListOptions{
		Since:   fmt.Sprintf("%d.%09d", since.Unix(), since.Nanosecond()),
		Until:   fmt.Sprintf("%d.%09d", time.Now().Unix(), time.Now().Nanosecond()),
		Filters: f,
	})
	n := 0
	for {
		select {
		case _, ok := <-res.Messages:
			if !ok {
				return n
			}
			n++
		case err := <-res.Err:
			if err != nil && err != io.EOF && !strings.Contains(err.Error(), "EOF") {
				h.t.Fatalf("reading docker events: %v", err)
			}
			return n
		}
	}
}

// instance is the gateway's instance name, as readyz tells it.
func (h *harness) instance() string {
	h.t.Helper()
	var ready struct {
		Instance string `json:"instance"`
	}
	h.api("GET", "/v1/readyz", nil, &ready)
	if ready.Instance == "" {
		h.t.Fatal("readyz names no instance")
	}
	return ready.Instance
}
