package caddymodule

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// reloadCaddyfile adapts src and loads it as a config reload of h's Caddy
// (same storage, so the same engine), then waits until the API is ready.
func (h *harness) reloadCaddyfile(src string) {
	h.t.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
	if err != nil {
		h.t.Fatalf("adapting Caddyfile: %v\n%s", err, src)
	}
	for _, w := range warnings {
		h.t.Logf("caddyfile warning: %s", w.String())
	}
	if err := caddy.Load(cfg, true); err != nil {
		h.t.Fatalf("loading config: %v", err)
	}
	h.waitReady()
}

// useT makes h report to t (a subtest) until the returned func is called.
func (h *harness) useT(t testing.TB) (restore func()) {
	prev := h.t
	h.t = t
	return func() { h.t = prev }
}

// dockerRecordState is the record state that agrees with what Docker itself
// (not sandwake, not through any proxy) shows of sandbox id's container.
func dockerRecordState(t *testing.T, cli *client.Client, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cli.ContainerInspect(ctx, docker.ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		return "no container: " + err.Error()
	}
	s := res.Container.State
	switch {
	case s.Paused:
		return "paused"
	case s.Running:
		return "running"
	default:
		return "stopped"
	}
}

// dockerAPIProxy is an HTTP-aware stand-in for the Docker daemon's socket:
// it can cut sandwake off (listener and every connection
// closed) and come back at the same path, and it also records which Docker
// API calls completed and which are in flight, so a test can cut at a known
// step of a wake rather than at a moment.
type dockerAPIProxy struct {
	t    testing.TB
	path string
	rp   *httputil.ReverseProxy

	mu        sync.Mutex
	srv       *http.Server // nil while cut
	completed []string     // "METHOD /path" of finished calls, in order
	inflight  map[*http.Request]string
	wg        sync.WaitGroup
}

// dockerSocket is the path of the Docker daemon's Unix socket.
func dockerSocket(t testing.TB) string {
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		return "/var/run/docker.sock"
	}
	path, ok := strings.CutPrefix(host, "unix://")
	if !ok {
		if testenv.RequireDocker() {
			t.Fatalf("DOCKER_HOST %q is not a unix socket; the socket-cut tests need one", host)
		}
		t.Skipf("DOCKER_HOST %q is not a unix socket; the socket-cut tests need one", host)
	}
	return path
}

func newDockerAPIProxy(t testing.TB) *dockerAPIProxy {
	t.Helper()
	target := dockerSocket(t)
	p := &dockerAPIProxy{
		t:        t,
		path:     filepath.Join(t.TempDir(), "docker.sock"),
		inflight: make(map[*http.Request]string),
	}
	var d net.Dialer
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme = "http"
			r.Out.URL.Host = "docker"
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", target)
			},
		},
		FlushInterval: -1, // the event stream must not be buffered
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	p.restore()
	t.Cleanup(func() {
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *dockerAPIProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	call := r.Method + " " + r.URL.Path
	p.mu.Lock()
	p.inflight[r] = call
	p.mu.Unlock()
	p.rp.ServeHTTP(w, r)
	p.mu.Lock()
	delete(p.inflight, r)
	p.completed = append(p.completed, call)
	p.mu.Unlock()
}

// restore serves again on the proxy's path.
func (p *dockerAPIProxy) restore() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		return
	}
	os.Remove(p.path) // a stale socket file would make Listen fail
	ln, err := net.Listen("unix", p.path)
	if err != nil {
		p.t.Fatalf("docker API proxy: %v", err)
	}
	srv := &http.Server{Handler: p, ErrorLog: log.New(io.Discard, "", 0)}
	p.srv = srv
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		srv.Serve(ln)
	}()
}

// cut closes the listener and every connection, the event stream included.
func (p *dockerAPIProxy) cut() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// calls returns the completed calls from index from on, and the calls in
// flight other than the event stream.
func (p *dockerAPIProxy) calls(from int) (completed, inflight []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	completed = append(completed, p.completed[min(from, len(p.completed)):]...)
	for _, c := range p.inflight {
		if !strings.HasSuffix(c, "/events") {
			inflight = append(inflight, c)
		}
	}
	return completed, inflight
}

// mark is the index of the next completed call.
func (p *dockerAPIProxy) mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.completed)
}

// TestDockerCutMidWake: Docker is cut off in the middle of a wake, then
// brought back. The held request ends with the app's 200 or a clear
// 503 + Retry-After JSON: never a 502, never a hang past hold_timeout. Once
// Docker is back, the store comes to agree with Docker, and no goroutine is
// left behind. Two cut points: as soon as Docker itself shows the container
// running (sandwake may still be waiting for the answer to its start call),
// and once sandwake's start and inspect calls are answered and it waits for
// the app, which listens only after STARTUP_DELAY (the readiness phase, which
// needs no Docker).
func TestDockerCutMidWake(t *testing.T) {
	const holdTimeout = 30 * time.Second
	proxy := newDockerAPIProxy(t)
	h := newHarness(t, fmt.Sprintf("docker_host unix://%s\n\t\thold_timeout %s\n\t\treconcile_interval 2s", proxy.path, holdTimeout))
	rec := h.create(map[string]string{"STARTUP_DELAY": "2s"})
	host := h.host(rec.ID, 8080)
	name := docker.ContainerName(rec.ID)
	e := engineFor(t, h)
	ci, err := h.cli.ContainerInspect(context.Background(), name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cid := ci.Container.ID

	phases := []struct {
		name string
		// cutNow reports whether the wake has reached the cut point, given
		// the Docker calls completed since the request was sent and those
		// in flight.
		cutNow func(t *testing.T, completed, inflight []string) (bool, string)
	}{
		{"docker shows the container running", func(t *testing.T, _, _ []string) (bool, string) {
			s := dockerRecordState(t, h.cli, rec.ID)
			return s == "running", "docker shows " + s
		}},
		{"readiness phase", func(_ *testing.T, completed, inflight []string) (bool, string) {
			started := -1
			for i, c := range completed {
				// The start addresses the container by its engine id (checked
				// to be this gateway's), the inspects by its name.
				if strings.HasPrefix(c, "POST ") && (strings.HasSuffix(c, "/containers/"+name+"/start") || strings.HasSuffix(c, "/containers/"+cid+"/start")) {
					started = i
				}
				if started >= 0 && i > started && strings.HasPrefix(c, "GET ") && strings.HasSuffix(c, "/containers/"+name+"/json") {
					// Inspects may be in flight at any moment now (the wake
					// watches the starting container for an early exit);
					// only a start still in flight is not the readiness phase.
					for _, f := range inflight {
						if strings.HasPrefix(f, "POST ") {
							return false, fmt.Sprintf("start and inspect answered; in flight: %v", inflight)
						}
					}
					return true, ""
				}
			}
			return false, fmt.Sprintf("docker calls so far: %v", completed)
		}},
	}
	for _, ph := range phases {
		t.Run(ph.name, func(t *testing.T) {
			defer h.useT(t)()
			// Docker healthy again: readiness answers 200 only with the
			// circuit closed, which the failures of a previous cut may
			// have opened.
			testenv.Eventually(t, 60*time.Second, func() (bool, string) {
				resp, err := http.Get(h.apiURL("/v1/readyz"))
				if err != nil {
					return false, err.Error()
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", resp.StatusCode, b)
			})
			h.stop(rec.ID)
			baseline := quiescentGoroutines(h)
			mark := proxy.mark()

			type result struct {
				status int
				header http.Header
				body   string
				err    error
				took   time.Duration
			}
			done := make(chan result, 1)
			// Bounded well past hold_timeout: a request that hung fails here.
			bounded := &http.Client{Transport: h.client.Transport, Timeout: holdTimeout + 15*time.Second}
			go func() {
				req, _ := http.NewRequest("GET", "http://"+host+"/healthz", nil)
				req.Header = apiHeader()
				start := time.Now()
				resp, err := bounded.Do(req)
				if err != nil {
					done <- result{err: err, took: time.Since(start)}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				done <- result{status: resp.StatusCode, header: resp.Header, body: string(b), took: time.Since(start)}
			}()

			testenv.Eventually(t, 30*time.Second, func() (bool, string) {
				completed, inflight := proxy.calls(mark)
				return ph.cutNow(t, completed, inflight)
			})
			_, wakingAtCut := e.mgr.Waking(rec.ID)
			proxy.cut()
			completed, inflight := proxy.calls(mark)
			t.Logf("docker cut; wake in flight: %v; calls answered: %v; in flight: %v", wakingAtCut, completed, inflight)
			if !wakingAtCut {
				t.Errorf("the wake was over before the cut (the app waits 2s before listening): the cut tested nothing")
			}

			var res result
			select {
			case res = <-done:
			case <-time.After(holdTimeout + 30*time.Second):
				t.Fatalf("the held request did not end within hold_timeout (%s) + 30s", holdTimeout)
			}
			proxy.restore()
			t.Logf("held request: %d Retry-After=%q in %s: %.300q (err %v)", res.status, res.header.Get("Retry-After"), res.took, res.body, res.err)
			switch {
			case res.err != nil:
				t.Errorf("held request failed: %v (after %s; hold_timeout %s)", res.err, res.took, holdTimeout)
			case res.status == http.StatusOK:
				if res.body != "ok\n" {
					t.Errorf("held request: 200 %q, want the app's \"ok\\n\"", res.body)
				}
			case res.status == http.StatusServiceUnavailable:
				var body apiError
				jerr := json.Unmarshal([]byte(res.body), &body)
				if res.header.Get("Retry-After") == "" || !strings.HasPrefix(res.header.Get("Content-Type"), "application/json") ||
					jerr != nil || body.Error.Code == "" || body.Error.Message == "" {
					t.Errorf("held request: 503 without Retry-After and a JSON error: %v %q", res.header, res.body)
				}
			default:
				t.Errorf("held request: %d %.300q, want 200 from the app or 503 + Retry-After JSON", res.status, res.body)
			}

			// Docker back: the store comes to agree with Docker.
			testenv.Eventually(t, 60*time.Second, func() (bool, string) {
				want := dockerRecordState(t, h.cli, rec.ID)
				got := h.state(rec.ID)
				return got == want, fmt.Sprintf("store says %s, docker shows %s", got, want)
			})
			t.Logf("after restore: store and docker agree on %s", h.state(rec.ID))
			resp, body := h.preview("GET", host, "/healthz", nil, apiHeader())
			if resp.StatusCode != http.StatusOK || body != "ok\n" {
				t.Errorf("after restore: %d %.300q, want the app's 200", resp.StatusCode, body)
			}

			var now int
			testenv.Eventually(t, 30*time.Second, func() (bool, string) {
				now = quiescentGoroutines(h)
				return now <= baseline+10, fmt.Sprintf("%d goroutines, baseline %d", now, baseline)
			})
			t.Logf("goroutines after recovery: %d (baseline %d)", now, baseline)
		})
	}
}

// TestStoreDirNotWritable: a sandwake app whose storage cannot be created
// (its path runs through a regular file, which stops root too) fails
// caddy.Load with an error naming the path and what failed, without a panic
// and without leaving goroutines behind.
func TestStoreDirNotWritable(t *testing.T) {
	caddyMu.Lock()
	t.Cleanup(func() {
		caddy.Stop()
		caddyMu.Unlock()
	})
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("not a directory\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	previewPort, apiPort := freePort(t), freePort(t)
	load := func(storage string) error {
		src := fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	storage file_system %s
	sandwake {
		storage %s
		label %s %s
		sandbox_network %s
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
`, filepath.Join(dir, "caddy"), storage, testenv.LabelRun, testenv.RunID(), testenv.Network(), previewPort, apiPort, testToken)
		cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
		if err != nil {
			t.Fatalf("adapting Caddyfile: %v", err)
		}
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("caddy.Load panicked with storage %s: %v", storage, r)
			}
		}()
		return caddy.Load(cfg, true)
	}
	goroutines := func() int {
		http.DefaultClient.CloseIdleConnections()
		return runtime.NumGoroutine()
	}

	tests := []struct {
		name    string
		storage string
	}{
		{"below a regular file", filepath.Join(file, "sub")},
		{"deeper below a regular file", filepath.Join(file, "a", "b")},
		{"a regular file", file},
	}
	// One load first: Caddy starts process-wide goroutines once, on the
	// first config, that are not the failed config's to stop.
	if err := load(tests[0].storage); err == nil {
		t.Fatalf("caddy.Load with storage %s succeeded", tests[0].storage)
	}
	baseline := goroutines()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range 3 {
				err := load(tt.storage)
				if err == nil {
					t.Fatalf("caddy.Load with storage %s succeeded", tt.storage)
				}
				if i == 0 {
					t.Logf("error: %v", err)
				}
				msg := err.Error()
				if !strings.Contains(msg, tt.storage) {
					t.Errorf("error does not name the storage path %s: %v", tt.storage, err)
				}
				if !strings.Contains(msg, "not a directory") || !strings.Contains(msg, "store") {
					t.Errorf("error does not say what failed (opening the store: not a directory): %v", err)
				}
			}
		})
	}
	// The ports are free again: nothing kept listening.
	for _, port := range []int{previewPort, apiPort} {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Errorf("port %d still taken after the failed loads: %v", port, err)
			continue
		}
		l.Close()
	}
	var now int
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		now = goroutines()
		return now <= baseline+2, fmt.Sprintf("%d goroutines after %d failed loads, %d after the first", now, 3*len(tests), baseline)
	})
	t.Logf("goroutines: %d after the first failed load, %d after %d more", baseline, now, 3*len(tests))
}

// withReadHeaderTimeout adds a servers { timeouts { read_header … } } global
// option to a harness Caddyfile.
func withReadHeaderTimeout(src, timeout string) string {
	return strings.Replace(src, "\tsandwake {",
		"\tservers {\n\t\ttimeouts {\n\t\t\tread_header "+timeout+"\n\t\t}\n\t}\n\tsandwake {", 1)
}

// slowWriter dials the preview port and writes data one byte every interval
// until it is all written, the server closes the connection, or stop is
// closed. Its reader reports how the connection ended.
type slowWriter struct {
	conn    net.Conn
	stop    chan struct{}
	wg      sync.WaitGroup
	written atomic.Int64
	ended   chan error // the first read's error (io.EOF when the server closed)
	data    chan []byte
}

func startSlowWriter(t *testing.T, port int, data string, interval time.Duration, readFor time.Duration) *slowWriter {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := &slowWriter{conn: conn, stop: make(chan struct{}), ended: make(chan error, 1), data: make(chan []byte, 1)}
	w.wg.Add(2)
	go func() {
		defer w.wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; i < len(data); i++ {
			if _, err := conn.Write([]byte{data[i]}); err != nil {
				return
			}
			w.written.Store(int64(i + 1))
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	go func() {
		defer w.wg.Done()
		conn.SetReadDeadline(time.Now().Add(readFor))
		b, err := io.ReadAll(conn)
		if err == nil {
			err = io.EOF
		}
		w.data <- b
		w.ended <- err
	}()
	t.Cleanup(w.close)
	return w
}

// close stops the writer, closes the connection and waits for both goroutines.
func (w *slowWriter) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.conn.Close()
	w.wg.Wait()
}

// TestSlowloris: clients that send their request headers one byte every
// 200 ms, to a sleeping sandbox, as a page load (warming page) and as an API
// call (held): Caddy's read_header timeout closes their connections, nothing
// is woken, and other clients are served meanwhile. A held request whose body
// arrives slowly does not hold up the wake or the other held requests.
func TestSlowloris(t *testing.T) {
	h := newHarness(t, "hold_timeout 30s")
	// Caddy's default read_header timeout is a minute (caddyhttp
	// defaultReadHeaderTimeout); the test sets a short one.
	h.reloadCaddyfile(withReadHeaderTimeout(h.caddyfile("hold_timeout 30s"), "2s"))
	running := h.create(nil)
	sleeping := h.create(nil)
	h.stop(sleeping.ID)
	since := time.Now()

	for _, kind := range []struct {
		name   string
		header string
	}{
		{"warming page", "Accept: text/html,application/xhtml+xml\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\n"},
		{"held request", "Accept: application/json\r\nUser-Agent: sdk/1.0\r\n"},
	} {
		t.Run(kind.name, func(t *testing.T) {
			defer h.useT(t)()
			req := "GET / HTTP/1.1\r\nHost: " + h.host(sleeping.ID, 8080) + "\r\n" + kind.header + "\r\n"
			const slow = 20
			writers := make([]*slowWriter, slow)
			for i := range writers {
				writers[i] = startSlowWriter(t, h.previewPort, req, 200*time.Millisecond, 10*time.Second)
			}
			// Meanwhile the gateway serves everyone else.
			for i := range 20 {
				resp, body := h.preview("GET", h.host(running.ID, 8080), "/healthz", nil, apiHeader())
				if resp.StatusCode != http.StatusOK || body != "ok\n" {
					t.Fatalf("request %d from another client while %d connections drip headers: %d %.200q", i, slow, resp.StatusCode, body)
				}
			}
			for i, w := range writers {
				err := <-w.ended
				got := <-w.data
				var ne net.Error
				written := int(w.written.Load())
				if errors.As(err, &ne) && ne.Timeout() {
					t.Errorf("slow connection %d: still open after 10s (%d of %d header bytes sent): no read_header timeout applied", i, written, len(req))
					continue
				}
				if written == len(req) {
					t.Errorf("slow connection %d: the whole request got through before the connection was closed", i)
				}
				if i == 0 {
					t.Logf("slow connection closed by the server after %d of %d header bytes: %v %q", written, len(req), err, got)
				}
				w.close()
			}
		})
	}
	if s := h.state(sleeping.ID); s != "stopped" {
		t.Fatalf("headers that never completed woke the sandbox: %s", s)
	}
	if n := h.startEvents(sleeping.ID, since); n != 0 {
		t.Fatalf("headers that never completed caused %d docker starts", n)
	}

	t.Run("slow body of a held request", func(t *testing.T) {
		defer h.useT(t)()
		const bodyLen = 1000 // 200 s at one byte every 200 ms: never done on its own
		body := strings.Repeat("b", bodyLen)
		head := "POST /echo HTTP/1.1\r\nHost: " + h.host(sleeping.ID, 8080) + "\r\nAccept: application/json\r\n" +
			fmt.Sprintf("Content-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", bodyLen)
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", h.previewPort), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, head); err != nil {
			t.Fatal(err)
		}
		// The held request is in: its wake starts (or is joined by others).
		e := engineFor(t, h)
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			_, waking := e.mgr.Waking(sleeping.ID)
			s := h.state(sleeping.ID)
			return waking || s == "running", "state " + s
		})
		drip := startBodyDrip(conn, body, 200*time.Millisecond)

		// Other held requests get the app while the body still drips.
		var wg sync.WaitGroup
		codes := make(chan string, 5)
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, err := h.previewCode(h.host(sleeping.ID, 8080), apiHeader())
				codes <- fmt.Sprintf("%d %v", status, err)
			}()
		}
		wg.Wait()
		close(codes)
		for c := range codes {
			if c != "200 <nil>" {
				t.Errorf("held request while another's body drips: %s, want 200", c)
			}
		}
		if s := h.state(sleeping.ID); s != "running" {
			t.Errorf("state %s while a held request's body drips, want running: the wake waited for the body", s)
		}
		sent := drip.finish()
		if sent >= bodyLen {
			t.Fatalf("the whole body dripped before the others were served; the test proved nothing")
		}
		t.Logf("%d of %d body bytes dripped while 5 other held requests got 200", sent, bodyLen)
		if _, err := io.WriteString(conn, body[sent:]); err != nil {
			t.Fatalf("sending the rest of the body: %v", err)
		}
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("reading the slow request's response: %v", err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(got) != "POST\n"+body {
			t.Fatalf("slow-body request: %d %.200q, want 200 and its body echoed whole", resp.StatusCode, got)
		}
	})
}

// bodyDrip writes a body one byte every interval until finish.
type bodyDrip struct {
	stop chan struct{}
	done chan int
}

func startBodyDrip(conn net.Conn, body string, interval time.Duration) *bodyDrip {
	d := &bodyDrip{stop: make(chan struct{}), done: make(chan int, 1)}
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		sent := 0
		defer func() { d.done <- sent }()
		for sent < len(body) {
			select {
			case <-d.stop:
				return
			case <-tick.C:
			}
			if _, err := conn.Write([]byte{body[sent]}); err != nil {
				return
			}
			sent++
		}
	}()
	return d
}

// finish stops the drip and returns how many bytes it sent.
func (d *bodyDrip) finish() int {
	close(d.stop)
	return <-d.done
}

// rawExchange sends raw bytes to the preview port and reads one response.
func rawExchange(port int, raw string) (int, string, error) {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), nil
}

// TestHostileHostHeaders: Host headers built to confuse the host parser or
// what stands before it get a 4xx (sandwake's 404, or the 400 of Go's HTTP
// server), never wake the harness's sandbox, and leave the gateway serving.
// They are sent over raw TCP, since net/http refuses to send most of them.
// The table runs twice: with the harness's *.preview.localhost site, where
// Caddy answers hosts the site does not match itself (an empty 200: no
// route), and with a catch-all site, where every host reaches sandwake.
func TestHostileHostHeaders(t *testing.T) {
	h := newHarness(t, "")
	running := h.create(nil)
	rec := h.create(nil)
	h.stop(rec.ID)
	since := time.Now()
	id, p := rec.ID, h.previewPort
	pct := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, "%%%02x", s[i])
		}
		return b.String()
	}
	// 64 KiB is past Caddy's default 16 KiB header limit (431); 12 KiB is
	// not, so those reach the site matcher and sandwake's host parser.
	long, mid := strings.Repeat("a", 64<<10), strings.Repeat("a", 12<<10)
	tests := []struct {
		name string
		host string // everything after "Host: " up to the request's own CRLF
	}{
		{"64 KiB label", "s-" + long + "-8080.preview.localhost"},
		{"64 KiB host", long},
		{"64 KiB of labels", strings.Repeat("a.", 32<<10) + "preview.localhost"},
		{"64 KiB port", "s-a-80.preview.localhost:" + strings.Repeat("9", 64<<10)},
		{"12 KiB label", "s-" + mid + "-8080.preview.localhost"},
		{"12 KiB id before the real one", fmt.Sprintf("s-%s%s-8080.preview.localhost", mid, id)},
		{"12 KiB of labels", strings.Repeat("a.", 6<<10) + "preview.localhost"},
		{"12 KiB port", fmt.Sprintf("s-a-80.preview.localhost:%s", strings.Repeat("9", 12<<10))},
		{"NUL in id", fmt.Sprintf("s-%s\x00-8080.preview.localhost:%d", id, p)},
		{"NUL after host", fmt.Sprintf("s-%s-8080.preview.localhost\x00.evil", id)},
		{"NUL only", "\x00"},
		{"percent NUL", fmt.Sprintf("s-%s-8080.preview.localhost%%00", id)},
		{"unicode id", fmt.Sprintf("s-%sé-8080.preview.localhost:%d", id, p)},
		{"unicode dot", fmt.Sprintf("s-%s-8080.preview。localhost", id)},
		{"fullwidth digits", fmt.Sprintf("s-%s-８０８０.preview.localhost", id)},
		{"punycode id", "s-xn--caf-dma-8080.preview.localhost"},
		{"punycode preview", fmt.Sprintf("s-%s-8080.xn--prview-bva.localhost", id)},
		{"double dot before domain", fmt.Sprintf("s-%s-8080.preview..localhost", id)},
		{"double dot before preview", fmt.Sprintf("s-%s-8080..preview.localhost", id)},
		{"dot dot", ".."},
		{"dot dot label", fmt.Sprintf("../s-%s-8080.preview.localhost", id)},
		{"trailing dots", fmt.Sprintf("s-%s-8080.preview.localhost..", id)},
		{"port out of range", "s-a-80.preview.localhost:99999"},
		{"userinfo", "s-a-80.preview.localhost@evil"},
		{"userinfo on real id", fmt.Sprintf("s-%s-8080.preview.localhost@evil", id)},
		{"userinfo before", fmt.Sprintf("evil@s-%s-8080.preview.localhost", id)},
		{"ipv6 loopback", "[::1]"},
		{"ipv6 with port", fmt.Sprintf("[::1]:%d", p)},
		{"ipv6 unclosed", fmt.Sprintf("[s-%s-8080.preview.localhost", id)},
		{"percent-encoded id", "s-%61-80.preview.localhost"},
		{"percent-encoded real id", fmt.Sprintf("s-%s-8080.preview.localhost", pct(id))},
		{"empty", ""},
		{"space inside", fmt.Sprintf("s-%s-8080.preview.localhost evil", id)},
		{"bare CR", fmt.Sprintf("s-%s-8080.preview.localhost\rX-Injected: 1", id)},
		{"bare LF header injection", "s-a-80.preview.localhost\nX-Injected: 1"},
		{"CRLF second request", "s-a-80.preview.localhost\r\n\r\nGET /admin HTTP/1.1\r\nHost: evil"},
		{"obs-fold", fmt.Sprintf("evil\r\n s-%s-8080.preview.localhost", id)},
		{"two Host headers", fmt.Sprintf("s-%s-8080.preview.localhost\r\nHost: s-%s-8080.preview.localhost", id, id)},
	}
	check := func(t *testing.T, catchAll bool) {
		defer h.useT(t)()
		answers := map[string][]string{}
		defer func() { t.Logf("answers: %v", answers) }()
		for _, tt := range tests {
			raw := "GET /healthz HTTP/1.1\r\nHost: " + tt.host + "\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
			status, body, err := rawExchange(p, raw)
			answers[fmt.Sprint(status)] = append(answers[fmt.Sprint(status)], tt.name)
			switch {
			case err != nil:
				t.Errorf("%s: no response: %v", tt.name, err)
			case status >= 400 && status < 500:
			case !catchAll && status == http.StatusOK && body == "":
				// Caddy's own answer to a host no site matches.
			default:
				t.Errorf("%s: %d %.200q, want a 4xx", tt.name, status, body)
			}
			if status == http.StatusOK && strings.Contains(body, "ok") {
				t.Errorf("%s: served by the app", tt.name)
			}
		}
		// The gateway keeps serving.
		resp, body := h.preview("GET", h.host(running.ID, 8080), "/healthz", nil, apiHeader())
		if resp.StatusCode != http.StatusOK || body != "ok\n" {
			t.Fatalf("after the hostile hosts: %d %.200q, want the app's 200", resp.StatusCode, body)
		}
	}
	t.Run("preview site", func(t *testing.T) { check(t, false) })
	h.reloadCaddyfile(strings.Replace(h.caddyfile(""),
		fmt.Sprintf("http://*.preview.localhost:%d {", p), fmt.Sprintf("http://:%d {", p), 1))
	t.Run("catch-all site", func(t *testing.T) { check(t, true) })

	if s := h.state(rec.ID); s != "stopped" {
		t.Fatalf("hostile hosts woke the sandbox: %s", s)
	}
	if n := h.startEvents(rec.ID, since); n != 0 {
		t.Fatalf("hostile hosts caused %d docker starts", n)
	}
}
