package preview

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	core "github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
)

// hotPathGate returns a gate over an engine holding one running sandbox
// "hot" on port 8080, and that engine's runtime (a fake that holds no
// container: the hot path must never reach it).
func hotPathGate(tb testing.TB) (*Handler, *lifecycletest.Runtime) {
	tb.Helper()
	dir := tb.TempDir()
	rt := lifecycletest.NewRuntime(nil)
	// The record is stored before the engine that serves it opens, as a
	// gateway restarted over its store finds it.
	seed, err := core.Open(core.Options{Dir: dir, Runtime: rt})
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now().UTC()
	_, _, err = seed.Store().Create(lifecycle.Record{
		ID: "hot", State: lifecycle.Running, Spec: lifecycle.Spec{Image: "x", Ports: []int{8080}},
		CreatedAt: now, StateSince: now, LastActiveAt: now, Upstreams: map[int]string{8080: "127.0.0.1:1"},
	}, "test")
	if cerr := seed.Close(); err != nil || cerr != nil {
		tb.Fatal(err, cerr)
	}
	e := &gateway.Gateway{Log: zap.NewNop()}
	c, err := core.Open(core.Options{Dir: dir, Runtime: rt, Manager: lifecycle.Config{
		OnChange: e.Changed,
	}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	e.Core, e.Mgr = c, c.Manager
	e.Routes = gateway.NewRouteCache(c.Manager)
	e.Current.Store(&gateway.Settings{Domain: "localhost", HoldTimeout: time.Second, MaxOpen: 256})
	e.Ready.Store(true)
	return New(func() *gateway.Gateway { return e }, zap.NewNop()), rt
}

// proxyStub stands in for reverse_proxy: it checks the upstream the gate
// chose for the dynamic upstream source.
type proxyStub struct{ tb testing.TB }

func (p proxyStub) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	set, ok := caddyhttp.GetVar(r.Context(), VarUpstream).(*gateway.UpstreamSet)
	if !ok || set.Dial != "127.0.0.1:1" {
		p.tb.Fatalf("upstream %+v", set)
	}
	return nil
}

func hotRequest() *http.Request {
	r := httptest.NewRequest("GET", "http://s-hot-8080.preview.localhost:8080/", nil)
	repl := caddy.NewReplacer()
	ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
	return r.WithContext(ctx)
}

// TestHotPathNeverTouchesEngineOrStore: a running sandbox is served from the
// route cache with in-memory activity; the runtime is never called and no
// event is written.
func TestHotPathNeverTouchesEngineOrStore(t *testing.T) {
	g, rt := hotPathGate(t)
	e := g.gateway()
	before, _ := e.Mgr.LastEventID()
	for range 1000 {
		if err := g.ServeHTTP(httptest.NewRecorder(), hotRequest(), proxyStub{t}); err != nil {
			t.Fatal(err)
		}
	}
	if calls := rt.Calls(); len(calls) != 0 {
		t.Fatalf("hot path called the runtime: %v", calls)
	}
	after, _ := e.Mgr.LastEventID()
	rec, _ := e.Mgr.Get("hot")
	if after != before || !rec.LastActiveAt.Equal(rec.CreatedAt) { // nothing flushed yet
		t.Fatalf("hot path wrote to the store: events %d→%d, last_active %s", before, after, rec.LastActiveAt)
	}
	a := e.Mgr.Activity("hot")
	if a.LastActive().IsZero() || a.OpenConnections() != 0 {
		t.Fatalf("activity: last %s open %d", a.LastActive(), a.OpenConnections())
	}
	// The activity reaches the store in one flush.
	if err := e.Mgr.FlushActivity(); err != nil {
		t.Fatal(err)
	}
	rec, _ = e.Mgr.Get("hot")
	if !rec.LastActiveAt.Equal(a.LastActive()) {
		t.Fatalf("flushed last_active %s, want %s", rec.LastActiveAt, a.LastActive())
	}
}

// TestHotPathAllocations bounds what the gate itself allocates per proxied
// request (the request, recorder and vars map are the caller's).
func TestHotPathAllocations(t *testing.T) {
	g, _ := hotPathGate(t)
	r := hotRequest()
	w := httptest.NewRecorder()
	var next caddyhttp.Handler = proxyStub{t}
	allocs := testing.AllocsPerRun(1000, func() {
		if err := g.ServeHTTP(w, r, next); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("gate allocates %v times per proxied request, want 0", allocs)
	}
}

// TestPageLoadAllocations: a browser's page load of a running public
// sandbox costs the card reader one allocation (its writer); other
// requests none (TestHotPathAllocations).
func TestPageLoadAllocations(t *testing.T) {
	g, _ := hotPathGate(t)
	r := hotRequest()
	r.Header.Set("Accept", "text/html,application/xhtml+xml")
	r.Header.Set("Sec-Fetch-Mode", "navigate")
	r.Header.Set("Sec-Fetch-Dest", "document")
	w := httptest.NewRecorder()
	var next caddyhttp.Handler = proxyStub{t}
	allocs := testing.AllocsPerRun(1000, func() {
		if err := g.ServeHTTP(w, r, next); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%v allocations per page load", allocs)
	if allocs > 1 {
		t.Fatalf("gate allocates %v times per page load, want at most 1 (the card writer)", allocs)
	}
}

// BenchmarkGateHotPath measures the gate's own cost for a running sandbox.
//
//	go test -run '^$' -bench GateHotPath -benchmem ./preview/
func BenchmarkGateHotPath(b *testing.B) {
	g, _ := hotPathGate(b)
	r := hotRequest()
	w := httptest.NewRecorder()
	var next caddyhttp.Handler = proxyStub{b}
	b.ReportAllocs()
	for b.Loop() {
		g.ServeHTTP(w, r, next)
	}
}

// TestHoldsRemembersAbsentIDs: an id this node does not hold (a sandbox of
// another node, forwarded there) is read from the store once and
// remembered, and a create here drops what was remembered.
func TestHoldsRemembersAbsentIDs(t *testing.T) {
	g, rt := hotPathGate(t)
	app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer app.Close()
	rt.SetUpstreams(map[int]string{8080: app.Listener.Addr().String()})
	e := g.gateway()
	if !e.Routes.Holds("hot") {
		t.Fatal("Holds(hot): false, want true")
	}
	n := e.Routes.Len()
	if e.Routes.Holds("elsewhere") {
		t.Fatal("Holds(elsewhere): true for an id with no record")
	}
	if got := e.Routes.Len(); got != n+1 {
		t.Fatalf("cached routes after an absent id: %d, want %d (the absence remembered)", got, n+1)
	}
	if _, err := e.Routes.Get("elsewhere"); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("Get of a remembered absence: %v, want ErrNotFound", err)
	}
	if _, err := e.Mgr.Create(context.Background(), lifecycle.CreateRequest{ID: "elsewhere", Spec: lifecycle.Spec{Image: "x", Ports: []int{8080}}}); err != nil {
		t.Fatal(err)
	}
	if !e.Routes.Holds("elsewhere") {
		t.Fatal("Holds(elsewhere) after its create here: false (a stale absence)")
	}
}
