package gatewaytest

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// DockerRecordState is the record state that agrees with what Docker itself
// (not sandwake, not through any proxy) shows of sandbox id's container.
func DockerRecordState(t *testing.T, cli *client.Client, id string) string {
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

// DockerAPIProxy is an HTTP-aware stand-in for the Docker daemon's socket:
// it can cut sandwake off (listener and every connection
// closed) and come back at the same path, and it also records which Docker
// API calls completed and which are in flight, so a test can cut at a known
// step of a wake rather than at a moment.
type DockerAPIProxy struct {
	t testing.TB
	// Path is the socket sandwake is given instead of the engine's.
	Path string
	rp   *httputil.ReverseProxy

	mu        sync.Mutex
	srv       *http.Server // nil while cut
	completed []string     // "METHOD /path" of finished calls, in order
	inflight  map[*http.Request]string
	wg        sync.WaitGroup
}

// DockerSocket is the path of the Docker daemon's Unix socket.
func DockerSocket(t testing.TB) string {
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

// NewDockerAPIProxy starts a proxy to the Docker daemon's socket; opts
// change its reverse proxy before it serves (e.g. ModifyResponse, to make
// the engine say something else of itself).
func NewDockerAPIProxy(t testing.TB, opts ...func(*httputil.ReverseProxy)) *DockerAPIProxy {
	t.Helper()
	target := DockerSocket(t)
	p := &DockerAPIProxy{
		t:        t,
		Path:     filepath.Join(t.TempDir(), "docker.sock"),
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
	for _, o := range opts {
		o(p.rp)
	}
	p.Restore()
	t.Cleanup(func() {
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// ServeHTTP relays a call to the engine's socket and records it.
func (p *DockerAPIProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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

// Restore serves again on the proxy's path.
func (p *DockerAPIProxy) Restore() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		return
	}
	os.Remove(p.Path) // a stale socket file would make Listen fail
	ln, err := net.Listen("unix", p.Path)
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

// Cut closes the listener and every connection, the event stream included.
func (p *DockerAPIProxy) Cut() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// Calls returns the completed calls from index from on, and the calls in
// flight other than the event stream.
func (p *DockerAPIProxy) Calls(from int) (completed, inflight []string) {
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

// Mark is the index of the next completed call.
func (p *DockerAPIProxy) Mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.completed)
}
