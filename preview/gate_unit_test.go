package preview

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/gateway"

	core "github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
)

// unitGate is a Gate over an engine (Badger in a temporary directory, the
// fake runtime) whose store holds recs when it opens; the fake's started
// containers answer HTTP on a loopback server, whose address is upstream.
type unitGate struct {
	g        *Handler
	e        *gateway.Gateway
	rt       *lifecycletest.Runtime
	upstream string
}

func newUnitGate(t *testing.T, recs ...lifecycle.Record) *unitGate {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(app.Close)
	upstream := app.Listener.Addr().String()
	rt := lifecycletest.NewRuntime(map[int]string{8080: upstream})
	dir := t.TempDir()
	seed, err := core.Open(core.Options{Dir: dir, Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if lifecycle.Resident(rec.State) && rec.Upstreams == nil {
			rec.Upstreams = map[int]string{8080: upstream}
		}
		if err := lifecycle.NormalizeSpec(&rec.Spec); err != nil {
			t.Fatal(err)
		}
		if _, _, err := seed.Store().Create(rec, "seed"); err != nil {
			t.Fatal(err)
		}
		switch rec.State {
		case lifecycle.Running:
			rt.Put(rec.ID, lifecycle.ContainerRunning)
		case lifecycle.Paused:
			rt.Put(rec.ID, lifecycle.ContainerPaused)
		case lifecycle.Stopped, lifecycle.Error:
			rt.Put(rec.ID, lifecycle.ContainerExited)
		case lifecycle.Creating:
			rt.Put(rec.ID, lifecycle.ContainerCreated)
		}
	}
	if err := seed.Close(); err != nil {
		t.Fatal(err)
	}
	e := &gateway.Gateway{Log: zap.NewNop(), Guard: gateway.NewWakeGuard(), Streams: gateway.NewStreamLimiter(), Clients: gateway.NewClientLimits()}
	c, err := core.Open(core.Options{Dir: dir, Runtime: rt, Manager: lifecycle.Config{
		OnChange: e.Changed,
		OnWake:   e.ObserveWake,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e.Core, e.Mgr = c, c.Manager
	e.Routes = gateway.NewRouteCache(c.Manager)
	if err := c.Manager.Start(); err != nil {
		t.Fatal(err)
	}
	e.Current.Store(&gateway.Settings{Domain: "localhost", HoldTimeout: 10 * time.Second, PreviewSecret: []byte("unit-test-secret"), RobotsTxt: true})
	e.Guard.Configure([]string{"crawlerbot"}, 0, 0)
	e.Ready.Store(true)
	rt.ResetCalls()
	return &unitGate{g: New(func() *gateway.Gateway { return e }, zap.NewNop()), e: e, rt: rt, upstream: upstream}
}

// unitRecord is a record of sandbox id in state, serving port 8080, with
// its container's address when running.
func unitRecord(id string, state lifecycle.State, mutate func(*lifecycle.Record)) *lifecycle.Record {
	now := time.Now().UTC()
	rec := lifecycle.Record{ID: id, State: state, Spec: lifecycle.Spec{Image: "sandwake/testapp:1", Ports: []int{8080}},
		CreatedAt: now, StateSince: now, LastActiveAt: now}
	if mutate != nil {
		mutate(&rec)
	}
	return &rec
}

// proxied is the next handler in the unit tests: it answers 200 "proxied to
// <dial>" for the upstream the gate chose.
func proxied(w http.ResponseWriter, r *http.Request) error {
	set, ok := caddyhttp.GetVar(r.Context(), VarUpstream).(*gateway.UpstreamSet)
	if !ok {
		return errors.New("no upstream chosen")
	}
	fmt.Fprintf(w, "proxied to %s", set.Dial)
	return nil
}

// TestGateDecisions: what the gate answers, per sandbox state and kind of
// client, and which engine calls it makes for it.
func TestGateDecisions(t *testing.T) {
	page := http.Header{"Accept": {"text/html"}}
	api := http.Header{"Accept": {"application/json"}}
	tests := []struct {
		name      string
		rec       *lifecycle.Record // stored before the engine opens
		notReady  bool
		method    string
		host      string
		path      string
		header    http.Header
		failStart error
		// want: status, JSON error code ("" when not JSON), body
		// fragment ({upstream}: the fake container's address), and the
		// runtime calls made (nil: none).
		wantStatus int
		wantCode   string
		wantBody   string
		wantCalls  map[string]int
	}{
		{name: "engine starting", notReady: true, host: "s-app-8080.preview.localhost", header: api,
			wantStatus: http.StatusServiceUnavailable},
		{name: "not a preview host", host: "example.com", header: api,
			wantStatus: http.StatusNotFound, wantCode: "not_found"},
		{name: "unknown sandbox", host: "s-nosuch-8080.preview.localhost", header: api,
			wantStatus: http.StatusNotFound, wantCode: "not_found"},
		{name: "undeclared port", rec: unitRecord("app", lifecycle.Running, nil), host: "s-app-9090.preview.localhost", header: api,
			wantStatus: http.StatusNotFound, wantCode: "not_found", wantBody: "does not serve port 9090"},
		{name: "running: proxied without the engine", rec: unitRecord("app", lifecycle.Running, func(r *lifecycle.Record) {
			r.Upstreams = map[int]string{8080: "127.0.0.1:1"}
		}), host: "s-app-8080.preview.localhost", header: api,
			wantStatus: http.StatusOK, wantBody: "proxied to 127.0.0.1:1"},
		{name: "robots.txt answered by the gate", rec: unitRecord("app", lifecycle.Stopped, nil), host: "s-app-8080.preview.localhost", path: "/robots.txt",
			wantStatus: http.StatusOK, wantBody: "Disallow: /"},
		{name: "stopped, API client: held through a wake", rec: unitRecord("app", lifecycle.Stopped, nil), host: "s-app-8080.preview.localhost", header: api,
			wantStatus: http.StatusOK, wantBody: "proxied to {upstream}", wantCalls: map[string]int{"Start": 1}},
		{name: "paused, API client: held through an unpause", rec: unitRecord("app", lifecycle.Paused, nil), host: "s-app-8080.preview.localhost", header: api,
			wantStatus: http.StatusOK, wantBody: "proxied to {upstream}", wantCalls: map[string]int{"Unpause": 1}},
		{name: "stopped, page load: warming page, wake started", rec: unitRecord("app", lifecycle.Stopped, nil), host: "s-app-8080.preview.localhost", header: page,
			wantStatus: http.StatusServiceUnavailable, wantBody: "<html", wantCalls: map[string]int{"Start": 1}},
		{name: "stopped, crawler: refused without a wake", rec: unitRecord("app", lifecycle.Stopped, nil), host: "s-app-8080.preview.localhost",
			header:     http.Header{"Accept": {"text/html"}, "User-Agent": {"CrawlerBot/2.1"}},
			wantStatus: http.StatusServiceUnavailable},
		{name: "stopped, engine down: 503 unavailable", rec: unitRecord("app", lifecycle.Stopped, nil), host: "s-app-8080.preview.localhost", header: api,
			failStart:  fmt.Errorf("starting: %w", lifecycle.ErrUnavailable),
			wantStatus: http.StatusServiceUnavailable, wantCode: "unavailable", wantCalls: map[string]int{"Start": 1}},
		{name: "creating, API client: 409", rec: unitRecord("app", lifecycle.Creating, nil), host: "s-app-8080.preview.localhost", header: api,
			wantStatus: http.StatusConflict, wantCode: "creating"},
		{name: "creating, page load: page", rec: unitRecord("app", lifecycle.Creating, nil), host: "s-app-8080.preview.localhost", header: page,
			wantStatus: http.StatusServiceUnavailable, wantBody: "<html"},
		{name: "killed, API client: explained, not woken", rec: unitRecord("app", lifecycle.Killed, func(r *lifecycle.Record) { r.Reason = "oom" }), host: "s-app-8080.preview.localhost", header: api,
			wantStatus: http.StatusServiceUnavailable, wantCode: "sandbox_killed"},
		{name: "error, page load: page, not woken", rec: unitRecord("app", lifecycle.Error, nil), host: "s-app-8080.preview.localhost", header: page,
			wantStatus: http.StatusServiceUnavailable, wantBody: "<html"},
		{name: "expired, API client: explained, not woken", rec: unitRecord("app", lifecycle.Expired, nil), host: "s-app-8080.preview.localhost", header: api,
			wantStatus: http.StatusServiceUnavailable, wantCode: "sandbox_expired"},
		{name: "private without a token: 401, not woken", rec: unitRecord("app", lifecycle.Stopped, func(r *lifecycle.Record) { r.Spec.Access = lifecycle.AccessPrivate }),
			host: "s-app-8080.preview.localhost", header: api,
			wantStatus: http.StatusUnauthorized, wantCode: "unauthorized"},
		{name: "status of a stopped sandbox", rec: unitRecord("app", lifecycle.Stopped, nil), host: "s-app-8080.preview.localhost", path: pathStatus, header: api,
			wantStatus: http.StatusOK, wantBody: `"state": "stopped"`},
		{name: "wake path refuses GET", rec: unitRecord("app", lifecycle.Stopped, nil), host: "s-app-8080.preview.localhost", path: pathWake, header: api,
			wantStatus: http.StatusMethodNotAllowed, wantCode: "method"},
		{name: "wake path POST wakes", rec: unitRecord("app", lifecycle.Stopped, nil), host: "s-app-8080.preview.localhost", path: pathWake, method: http.MethodPost, header: api,
			wantStatus: http.StatusAccepted, wantCalls: map[string]int{"Start": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var recs []lifecycle.Record
			if tt.rec != nil {
				recs = append(recs, *tt.rec)
			}
			u := newUnitGate(t, recs...)
			if tt.notReady {
				u.e.Ready.Store(false)
			}
			if tt.failStart != nil {
				u.rt.FailWith("Start", tt.failStart)
			}
			method, path := tt.method, tt.path
			if method == "" {
				method = http.MethodGet
			}
			if path == "" {
				path = "/"
			}
			r := hotRequest()
			r.Method, r.Host, r.URL.Path, r.Header = method, tt.host, path, tt.header.Clone()
			if r.Header == nil {
				r.Header = http.Header{}
			}
			w := httptest.NewRecorder()
			if err := u.g.ServeHTTP(w, r, caddyhttp.HandlerFunc(proxied)); err != nil {
				t.Fatalf("ServeHTTP: %v", err)
			}
			if w.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d; body %s", w.Code, tt.wantStatus, w.Body)
			}
			if tt.wantCode != "" {
				var body client.ErrorResponse
				if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Error.Code != tt.wantCode {
					t.Fatalf("error code %q (%v), want %q; body %s", body.Error.Code, err, tt.wantCode, w.Body)
				}
			}
			if want := strings.ReplaceAll(tt.wantBody, "{upstream}", u.upstream); !strings.Contains(w.Body.String(), want) {
				t.Fatalf("body %q does not contain %q", w.Body, want)
			}
			// A wake started for a page load runs on after the answer:
			// wait for its calls, then check nothing else was asked.
			deadline := time.Now().Add(10 * time.Second)
			for !callsAtLeast(u.rt.Calls(), tt.wantCalls) {
				if time.Now().After(deadline) {
					t.Fatalf("runtime calls %v, want %v", u.rt.Calls(), tt.wantCalls)
				}
				time.Sleep(time.Millisecond)
			}
			if _, waking := u.e.Mgr.Waking("app"); !waking {
				if got := u.rt.Calls(); !callsEqual(got, tt.wantCalls) {
					t.Fatalf("runtime calls %v, want %v", got, tt.wantCalls)
				}
			}
		})
	}
}

// callsAtLeast reports whether got has at least the count of every method
// of want.
func callsAtLeast(got, want map[string]int) bool {
	for m, n := range want {
		if got[m] < n {
			return false
		}
	}
	return true
}

// callsEqual reports whether got and want hold the same non-zero counts.
func callsEqual(got, want map[string]int) bool {
	for m, n := range got {
		if n != want[m] {
			return false
		}
	}
	return callsAtLeast(got, want)
}

// TestUnavailableSaysStartingOrStopping: with no engine ready, the gate
// answers 503 with Retry-After, saying the gateway is starting, or, once
// its server shuts down (a pod replaced, a forward reaching it then),
// stopping.
func TestUnavailableSaysStartingOrStopping(t *testing.T) {
	g := New(func() *gateway.Gateway { return nil }, zap.NewNop())
	ask := func() (int, string, string) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "http://s-x-8080.preview.localhost/", nil)
		r.Header.Set("Accept", "application/json")
		if err := g.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
			t.Fatal(err)
		}
		var e client.ErrorResponse
		json.Unmarshal(w.Body.Bytes(), &e)
		return w.Code, e.Error.Code + ": " + e.Error.Message, w.Header().Get("Retry-After")
	}
	if code, msg, ra := ask(); code != http.StatusServiceUnavailable || msg != "unavailable: sandwake is starting" || ra == "" {
		t.Fatalf("before the engine: %d %q Retry-After %q", code, msg, ra)
	}
	g.Shutdown(false)
	if code, msg, ra := ask(); code != http.StatusServiceUnavailable || msg != "unavailable: sandwake is stopping" || ra == "" {
		t.Fatalf("while the server shuts down: %d %q Retry-After %q", code, msg, ra)
	}
}
