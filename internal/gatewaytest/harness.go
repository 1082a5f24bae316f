package gatewaytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// sandwake's modules, as a build with the module root has them.
	dockerclient "github.com/moby/moby/client"

	_ "github.com/sandwake/sandwake/caddymodule"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// Token is the admin token of a harness's API.
const Token = "test-token-0123456789"

// Harness is a real Caddy, in this process, serving sandwake on loopback
// ports of its own, with its store in a temporary directory and every
// container it makes labelled for cleanup.
type Harness struct {
	T           testing.TB
	Docker      *dockerclient.Client
	Image       string // the test app's image
	PreviewPort int
	APIPort     int
	Dir         string
	Extra       string // extra lines for the sandwake global option
	// Client dials every preview host on loopback, whatever its name.
	Client *http.Client

	// starts are the start events of the run's containers, by container
	// name, as a live subscription saw them (see StartEvents).
	startsMu sync.Mutex
	starts   map[string][]time.Time
}

// caddyMu serialises in-process Caddy instances: Caddy keeps one running
// config per process.
var caddyMu sync.Mutex

// LockCaddy reserves this process's Caddy for a test that loads configs of
// its own, until t ends, when its config is stopped.
func LockCaddy(t testing.TB) {
	caddyMu.Lock()
	t.Cleanup(func() {
		caddy.Stop()
		caddyMu.Unlock()
	})
}

// FreePort is a loopback port no listener holds now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// New starts a harness whose sandwake global option has the extra lines.
func New(t testing.TB, extra string) *Harness {
	t.Helper()
	h := NewWithCaddyfile(t, func(h *Harness) string { return h.Caddyfile(extra) })
	h.Extra = extra
	return h
}

// NewWithCaddyfile starts a harness whose Caddyfile render returns, once
// the harness's ports and directory are known.
func NewWithCaddyfile(t testing.TB, render func(h *Harness) string) *Harness {
	t.Helper()
	h := NewBare(t)
	h.Docker = testenv.Docker(t)
	h.Image = testenv.TestAppImage(t)
	h.watchStarts()
	caddyMu.Lock()
	var instance string
	t.Cleanup(func() {
		caddy.Stop()
		caddyMu.Unlock()
		// Once the gateway is gone (its reconcile would make the network
		// again): each instance has a network of its own.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		testenv.RemoveInstance(ctx, h.Docker, instance)
	})
	h.LoadText(render(h))
	h.WaitReady()
	instance = h.Instance()
	return h
}

// NewBare is a harness without an engine and without Caddy: its ports,
// directory and preview client, for a test that brings its own engine
// (a Kubernetes cluster) and loads its own Caddyfile (LockCaddy, LoadText,
// WaitReady). Docker, Image and the start events are unset.
func NewBare(t testing.TB) *Harness {
	t.Helper()
	h := &Harness{T: t, PreviewPort: FreePort(t), APIPort: FreePort(t), Dir: t.TempDir()}
	// Every preview host is dialled on loopback, whatever its name.
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	h.Client = &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", h.PreviewPort))
			},
			MaxIdleConnsPerHost: 64,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return h
}

// Caddyfile renders the harness's Caddyfile with extra global options.
func (h *Harness) Caddyfile(extra string) string {
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
`, filepath.Join(h.Dir, "caddy"), filepath.Join(h.Dir, "sandwake"), h.PreviewPort,
		testenv.LabelRun, testenv.RunID(), extra, h.PreviewPort, h.APIPort, Token)
}

// Load adapts the harness's Caddyfile with extra global options and loads
// it: the first call starts Caddy, later calls are config reloads.
func (h *Harness) Load(extra string) { h.LoadText(h.Caddyfile(extra)) }

// LoadText adapts a Caddyfile and loads it.
func (h *Harness) LoadText(caddyfile string) {
	h.T.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		h.T.Fatalf("adapting Caddyfile: %v", err)
	}
	for _, w := range warnings {
		h.T.Logf("caddyfile warning: %s", w.String())
	}
	if err := caddy.Load(cfg, true); err != nil {
		h.T.Fatalf("loading config: %v", err)
	}
	// A reload binds each port's new socket beside the old one
	// (SO_REUSEPORT) and closes the old one as the old servers shut down,
	// which Caddy starts but may not have done when Load returns: a
	// connection queued on the old socket then is reset at connect. The
	// reload is done once each port has one listening socket left.
	for _, port := range []int{h.PreviewPort, h.APIPort} {
		testenv.Eventually(h.T, 10*time.Second, func() (bool, string) {
			n, err := listeners(port)
			return err == nil && n == 1, fmt.Sprintf("port %d: %d listening sockets (%v), want the new config's alone", port, n, err)
		})
	}
}

// listeners counts the TCP sockets listening on port (/proc/net/tcp and
// tcp6).
func listeners(port int) (int, error) {
	want := fmt.Sprintf(":%04X", port)
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			// local_address is fields[1], st fields[3]: 0A is LISTEN.
			if len(fields) > 3 && strings.HasSuffix(fields[1], want) && fields[3] == "0A" {
				n++
			}
		}
	}
	return n, nil
}

// WaitReady waits until readyz answers 200.
func (h *Harness) WaitReady() {
	testenv.Eventually(h.T, 20*time.Second, func() (bool, string) {
		resp, err := http.Get(h.APIURL("/v1/readyz"))
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
}

// APIURL is the URL of path on the harness's API.
func (h *Harness) APIURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", h.APIPort, path)
}

// API calls the management API with the admin token and decodes a JSON
// answer into out (if not nil); it returns the status.
func (h *Harness) API(method, path string, body any, out any) int {
	h.T.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.APIURL(path), rd)
	req.Header.Set("Authorization", "Bearer "+Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.T.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			h.T.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

// Create makes a running sandbox through the API and registers its
// removal.
func (h *Harness) Create(extraEnv map[string]string) client.Sandbox {
	h.T.Helper()
	id := testenv.UniqueID("g")
	h.RemoveOnCleanup(id)
	var rec client.Sandbox
	status := h.API("POST", "/v1/sandboxes", map[string]any{"id": id, "image": h.Image, "ports": []int{8080}, "env": extraEnv}, &rec)
	if status != http.StatusCreated || rec.State != string(lifecycle.Running) {
		h.T.Fatalf("create: %d %+v", status, rec)
	}
	return rec
}

// RemoveOnCleanup removes sandbox id's container and volume when the test
// ends.
func (h *Harness) RemoveOnCleanup(id string) {
	h.T.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h.Docker.ContainerRemove(ctx, docker.ContainerName(id), dockerclient.ContainerRemoveOptions{Force: true})
		h.Docker.VolumeRemove(ctx, docker.VolumeName(id), dockerclient.VolumeRemoveOptions{Force: true})
		// A sandbox with services: its members (s-<id>--<name>) and their
		// volumes.
		members := "s-" + id + "--"
		if cs, err := h.Docker.ContainerList(ctx, dockerclient.ContainerListOptions{All: true, Filters: dockerclient.Filters{}.Add("name", members)}); err == nil {
			for _, c := range cs.Items {
				for _, n := range c.Names {
					if strings.HasPrefix(strings.TrimPrefix(n, "/"), members) {
						h.Docker.ContainerRemove(ctx, c.ID, dockerclient.ContainerRemoveOptions{Force: true})
						break
					}
				}
			}
		}
		if vs, err := h.Docker.VolumeList(ctx, dockerclient.VolumeListOptions{Filters: dockerclient.Filters{}.Add("name", members)}); err == nil {
			for _, v := range vs.Items {
				if strings.HasPrefix(v.Name, members) {
					h.Docker.VolumeRemove(ctx, v.Name, dockerclient.VolumeRemoveOptions{Force: true})
				}
			}
		}
	})
}

// Stop stops sandbox id through the API.
func (h *Harness) Stop(id string) {
	h.T.Helper()
	var rec client.Sandbox
	if status := h.API("POST", "/v1/sandboxes/"+id+"/stop", nil, &rec); status != 200 || rec.State != "stopped" {
		h.T.Fatalf("stop: %d %+v", status, rec)
	}
}

// State is sandbox id's state as the API shows it.
func (h *Harness) State(id string) string {
	h.T.Helper()
	var rec client.Sandbox
	h.API("GET", "/v1/sandboxes/"+id, nil, &rec)
	return rec.State
}

// Host is the preview host of a sandbox's port.
func (h *Harness) Host(id string, port int) string {
	return fmt.Sprintf("s-%s-%d.preview.localhost:%d", id, port, h.PreviewPort)
}

// Preview sends a request to a preview host (dialled on loopback).
func (h *Harness) Preview(method, host, path string, body io.Reader, header http.Header) (*http.Response, string) {
	h.T.Helper()
	resp, b, err := h.PreviewErr(method, host, path, body, header)
	if err != nil {
		h.T.Fatal(err)
	}
	return resp, b
}

// PreviewErr is Preview for goroutines other than the test's: it returns
// the error instead of failing the test.
func (h *Harness) PreviewErr(method, host, path string, body io.Reader, header http.Header) (*http.Response, string, error) {
	req, err := http.NewRequest(method, "http://"+host+path, body)
	if err != nil {
		return nil, "", err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := h.Client.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("%s %s%s: %w", method, host, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// BrowserHeader is what a browser sends for a page load.
func BrowserHeader() http.Header {
	return http.Header{
		"Accept":         {"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"},
		"Sec-Fetch-Mode": {"navigate"},
		"Sec-Fetch-Dest": {"document"},
	}
}

// watchStarts follows the engine's start events of this run's containers
// until the test ends. Docker replays only its last 256 events to a
// "since" query, which packages testing in parallel roll over in seconds;
// a live subscription misses none.
func (h *Harness) watchStarts() {
	h.starts = map[string][]time.Time{}
	ctx, cancel := context.WithCancel(context.Background())
	f := dockerclient.Filters{}.Add("type", "container").Add("event", "start").Add("label", testenv.LabelRun+"="+testenv.RunID())
	res := h.Docker.Events(ctx, dockerclient.EventsListOptions{Filters: f})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case m, ok := <-res.Messages:
				if !ok {
					return
				}
				name := m.Actor.Attributes["name"]
				h.startsMu.Lock()
				h.starts[name] = append(h.starts[name], time.Unix(0, m.TimeNano))
				h.startsMu.Unlock()
			case <-res.Err:
				return
			}
		}
	}()
	h.T.Cleanup(func() {
		cancel()
		<-done
	})
}

// StartEvents counts "start" events of a container on the engine between
// since and now: the engine's own count, independent of sandwake. It is the
// larger of what the live subscription saw (complete, but an event may
// still be on its way) and what Docker replays (at once, but only its last
// 256 events).
func (h *Harness) StartEvents(id string, since time.Time) int {
	h.T.Helper()
	live := 0
	h.startsMu.Lock()
	for _, at := range h.starts[docker.ContainerName(id)] {
		if !at.Before(since) {
			live++
		}
	}
	h.startsMu.Unlock()
	return max(live, h.replayedStarts(id, since))
}

// replayedStarts counts the start events Docker replays for sandbox id's
// container between since and now.
func (h *Harness) replayedStarts(id string, since time.Time) int {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := dockerclient.Filters{}.Add("container", docker.ContainerName(id)).Add("event", "start").Add("type", "container")
	res := h.Docker.Events(ctx, dockerclient.EventsListOptions{
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
				h.T.Fatalf("reading docker events: %v", err)
			}
			return n
		}
	}
}

// Instance is the gateway's instance name, as readyz tells it.
func (h *Harness) Instance() string {
	h.T.Helper()
	var ready struct {
		Instance string `json:"instance"`
	}
	h.API("GET", "/v1/readyz", nil, &ready)
	if ready.Instance == "" {
		h.T.Fatal("readyz names no instance")
	}
	return ready.Instance
}

// APIHeader is what an API client (fetch, curl, an SDK) sends: never a page
// load, so sandwake holds it instead of showing the warming page.
func APIHeader() http.Header {
	return http.Header{"Accept": {"application/json"}}
}

// CreateWith creates a sandbox through the API with the testapp image,
// port 8080 and the given extra fields, registering the removal of its
// container and volume first (so a failed create is cleaned up too). It
// returns the API's status and record.
func (h *Harness) CreateWith(extra map[string]any) (int, client.Sandbox) {
	h.T.Helper()
	id := testenv.UniqueID("a")
	h.T.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h.Docker.ContainerRemove(ctx, docker.ContainerName(id), dockerclient.ContainerRemoveOptions{Force: true})
		h.Docker.VolumeRemove(ctx, docker.VolumeName(id), dockerclient.VolumeRemoveOptions{Force: true})
	})
	body := map[string]any{"id": id, "image": h.Image, "ports": []int{8080}}
	for k, v := range extra {
		body[k] = v
	}
	var raw json.RawMessage
	status := h.API("POST", "/v1/sandboxes", body, &raw)
	var rec client.Sandbox
	if status == http.StatusCreated {
		if err := json.Unmarshal(raw, &rec); err != nil {
			h.T.Fatalf("create: decoding %s: %v", raw, err)
		}
	} else {
		h.T.Logf("create %s: %d %s", id, status, raw)
	}
	rec.ID = id
	return status, rec
}
