package lifecycle

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// probeServer answers readiness probes: with status until the probe count
// reaches flipAfter, then 200 (flipAfter 0: never flips).
type probeServer struct {
	probes    atomic.Int32
	srv       *httptest.Server
	mu        sync.Mutex
	paths     []string
	userAgent string
}

func newProbeServer(t *testing.T, status int, flipAfter int32) *probeServer {
	t.Helper()
	p := &probeServer{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := p.probes.Add(1)
		p.mu.Lock()
		p.paths = append(p.paths, r.URL.Path)
		p.userAgent = r.UserAgent()
		p.mu.Unlock()
		if flipAfter > 0 && n > flipAfter {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *probeServer) addr() string { return p.srv.Listener.Addr().String() }

// tcpServer accepts connections and either closes them at once or holds them
// open until the test ends.
func tcpServer(t *testing.T, closeAtOnce bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if closeAtOnce {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// shortCtx bounds a probe that is expected never to succeed. The bound is
// how long the test gives up after, not something asserted.
func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

func longCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestWaitReadyHTTP(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		flipAfter  int32
		readyPath  string
		wantProbes int32
		wantPath   string
	}{
		{"200 at once", http.StatusOK, 0, "", 1, "/"},
		{"500 without ready path counts", http.StatusInternalServerError, 0, "", 1, "/"},
		{"404 with ready path counts", http.StatusNotFound, 0, "/healthz", 1, "/healthz"},
		{"redirect not followed", http.StatusFound, 0, "/healthz", 1, "/healthz"},
		{"500 with ready path until it flips", http.StatusInternalServerError, 3, "/healthz", 4, "/healthz"},
		{"503 with ready path until it flips", http.StatusServiceUnavailable, 5, "/ready", 6, "/ready"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProbeServer(t, tt.status, tt.flipAfter)
			spec := testSpec()
			spec.ReadyPath = tt.readyPath
			if err := NormalizeSpec(&spec); err != nil {
				t.Fatal(err)
			}
			if err := WaitReady(longCtx(t), p.addr(), &spec); err != nil {
				t.Fatal(err)
			}
			if n := p.probes.Load(); n != tt.wantProbes {
				t.Fatalf("%d probes, want %d", n, tt.wantProbes)
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			for _, path := range p.paths {
				if path != tt.wantPath {
					t.Fatalf("probed %q, want %q", path, tt.wantPath)
				}
			}
			if p.userAgent != "sandwake-readiness" {
				t.Fatalf("user agent %q", p.userAgent)
			}
		})
	}
}

func TestWaitReadyNotReady(t *testing.T) {
	tests := []struct {
		name string
		mode string
		addr func(t *testing.T) string
		path string
	}{
		{"http, closed port", ReadyHTTP, closedAddr, ""},
		{"tcp, closed port", ReadyTCP, closedAddr, ""},
		{"http, always 500 with ready path", ReadyHTTP, func(t *testing.T) string {
			return newProbeServer(t, http.StatusInternalServerError, 0).addr()
		}, "/healthz"},
		// A port that accepts TCP but never speaks HTTP is not an HTTP app.
		{"http, silent tcp listener", ReadyHTTP, func(t *testing.T) string { return tcpServer(t, false) }, ""},
		// Docker's userland proxy accepts and closes when the app is not
		// listening: that is not ready.
		{"tcp, accepted and closed at once", ReadyTCP, func(t *testing.T) string { return tcpServer(t, true) }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := testSpec()
			spec.ReadyMode = tt.mode
			spec.ReadyPath = tt.path
			if err := NormalizeSpec(&spec); err != nil {
				t.Fatal(err)
			}
			addr := tt.addr(t)
			err := WaitReady(shortCtx(t), addr, &spec)
			if !errors.Is(err, ErrNotReady) {
				t.Fatalf("err = %v, want ErrNotReady", err)
			}
		})
	}
}

func TestWaitReadyTCP(t *testing.T) {
	tests := []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"held open", func(t *testing.T) string { return tcpServer(t, false) }},
		{"http server", func(t *testing.T) string { return newProbeServer(t, http.StatusOK, 0).addr() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := testSpec()
			spec.ReadyMode = ReadyTCP
			if err := NormalizeSpec(&spec); err != nil {
				t.Fatal(err)
			}
			if err := WaitReady(longCtx(t), tt.addr(t), &spec); err != nil {
				t.Fatalf("WaitReady: %v", err)
			}
		})
	}
}
