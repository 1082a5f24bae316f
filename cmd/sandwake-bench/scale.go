package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/lifecycle"
)

// seedStates cycles through the states a large farm mostly holds (as
// lifecycle's scale benchmarks do): a quarter resident, most stopped.
var seedStates = []lifecycle.State{
	lifecycle.Running, lifecycle.Paused, lifecycle.Stopped, lifecycle.Stopped,
	lifecycle.Stopped, lifecycle.Stopped, lifecycle.Killed, lifecycle.Expired,
}

// seededStore is a Badger store on disk holding n records as the manager
// would have left them, and the containers an engine would list for them.
type seededStore struct {
	dir        string
	n          int
	at         time.Time // every record's timestamps
	running    []string  // ids of the running records
	containers []lifecycle.Container
}

// seedStore writes n records into a new store in dir, each in its own synced
// transaction, as sandwake writes them.
func seedStore(dir string, n int) (*seededStore, error) {
	eng, err := engine.Open(engine.Options{Dir: dir, Runtime: &listedRuntime{}})
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	st := eng.Store()
	s := &seededStore{dir: dir, n: n, at: time.Now().UTC()}
	spec := lifecycle.Spec{Image: "sandwake-bench-seed:none", Ports: []int{8080}, MemoryMB: 64}
	if err := lifecycle.NormalizeSpec(&spec); err != nil {
		return nil, err
	}
	for i := range n {
		id := fmt.Sprintf("sb%05d", i)
		state := seedStates[i%len(seedStates)]
		rec := lifecycle.Record{ID: id, Spec: spec, State: state, CreatedAt: s.at, LastActiveAt: s.at, StateSince: s.at}
		c := lifecycle.Container{ID: "seeded-" + id, SandboxID: id}
		switch state {
		case lifecycle.Running, lifecycle.Paused:
			rec.ContainerID = c.ID
			// Nothing listens there: requests in the benchmarks stop at the
			// gate (see gateLookup).
			rec.Upstreams = map[int]string{8080: "127.0.0.1:9"}
			c.State = lifecycle.ContainerRunning
			if state == lifecycle.Paused {
				c.State = lifecycle.ContainerPaused
			}
			if state == lifecycle.Running {
				s.running = append(s.running, id)
			}
		case lifecycle.Stopped:
			rec.ContainerID = c.ID
			c.State = lifecycle.ContainerExited
		}
		if c.State != "" {
			s.containers = append(s.containers, c)
		}
		if _, _, err := st.Create(rec, "seed"); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// listedRuntime is an engine that lists the seeded containers and must not
// be asked anything else: the reaper pass and the reconcile over a store that
// agrees with it have nothing to do but read.
type listedRuntime struct {
	containers []lifecycle.Container
	calls      atomic.Int64
}

func (r *listedRuntime) other() error { r.calls.Add(1); return lifecycle.ErrUnavailable }
func (r *listedRuntime) Create(context.Context, string, lifecycle.Spec) (lifecycle.Container, error) {
	return lifecycle.Container{}, r.other()
}
func (r *listedRuntime) Start(context.Context, string) (lifecycle.Container, error) {
	return lifecycle.Container{}, r.other()
}
func (r *listedRuntime) Pause(context.Context, string) error   { return r.other() }
func (r *listedRuntime) Unpause(context.Context, string) error { return r.other() }
func (r *listedRuntime) Stop(context.Context, string) error    { return r.other() }
func (r *listedRuntime) Remove(context.Context, string) error  { return r.other() }
func (r *listedRuntime) RemoveVolume(context.Context, string) (int64, error) {
	return 0, r.other()
}
func (r *listedRuntime) Inspect(context.Context, string) (lifecycle.Container, error) {
	return lifecycle.Container{}, r.other()
}
func (r *listedRuntime) List(context.Context) ([]lifecycle.Container, error) {
	return append([]lifecycle.Container(nil), r.containers...), nil
}
func (r *listedRuntime) Ping(context.Context) error { return nil }

// engineCosts times, over a seeded store, one reaper pass with nothing due
// (mean of passes), full and over the running and paused sandboxes alone
// (the loop's pass between full ones), and a boot: loading the records
// (NewManager) plus one full reconcile (mean of boots).
func engineCosts(s *seededStore, passes, boots int) (reap, reapResident, boot time.Duration, err error) {
	rt := &listedRuntime{containers: s.containers}
	now := func() time.Time { return s.at.Add(time.Minute) }
	ctx := context.Background()

	cfg := lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute, MaxLifetime: 24 * time.Hour,
		MaxResident: s.n, Now: now}
	eng, err := engine.Open(engine.Options{Dir: s.dir, Runtime: rt, Manager: cfg})
	if err != nil {
		return 0, 0, 0, err
	}
	defer eng.Close()
	st, m := eng.Store(), eng.Manager
	var total time.Duration
	for range passes {
		t0 := time.Now()
		stats, err := m.ReapOnce(ctx)
		total += time.Since(t0)
		if err != nil || stats.Scanned != s.n || stats.Total() != 0 || stats.Errors != 0 {
			m.Close()
			return 0, 0, 0, fmt.Errorf("reaper pass over %d records: %+v, %v", s.n, stats, err)
		}
	}
	reap = total / time.Duration(passes)
	total = 0
	resident := 0
	for _, c := range s.containers {
		if c.State == lifecycle.ContainerRunning || c.State == lifecycle.ContainerPaused {
			resident++
		}
	}
	for range passes {
		t0 := time.Now()
		stats, err := m.ReapResidentOnce(ctx)
		total += time.Since(t0)
		if err != nil || stats.Scanned != resident || stats.Total() != 0 || stats.Errors != 0 {
			m.Close()
			return 0, 0, 0, fmt.Errorf("resident reaper pass over %d records: %+v, %v", resident, stats, err)
		}
	}
	m.Close()
	reapResident = total / time.Duration(passes)

	total = 0
	for range boots {
		t0 := time.Now()
		m, err := lifecycle.NewManager(st, rt, lifecycle.Config{Now: now})
		if err != nil {
			return 0, 0, 0, err
		}
		stats, err := m.Reconcile(ctx)
		total += time.Since(t0)
		m.Close()
		if err != nil || stats.Records != s.n || len(stats.Corrections) != 0 || len(stats.Orphans) != 0 {
			return 0, 0, 0, fmt.Errorf("reconcile over %d records: %+v, %v", s.n, stats, err)
		}
	}
	if rt.calls.Load() != 0 {
		return 0, 0, 0, fmt.Errorf("the engine was asked %d times for more than its list", rt.calls.Load())
	}
	return reap, reapResident, total / time.Duration(boots), nil
}

// nullWriter is a ResponseWriter that keeps only the status.
type nullWriter struct {
	h      http.Header
	status int
}

func (w *nullWriter) Header() http.Header         { return w.h }
func (w *nullWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nullWriter) WriteHeader(code int)        { w.status = code }

// gateCost is what a request costs in process, with no network: the gate
// handler alone (the lookup: host parse, route cache, activity) and the whole
// handler chain of a Caddy server with the gate, and the same without it.
type gateCost struct {
	lookupNs, chainNs, plainNs float64
	lookupAllocs, chainAllocs  int64
}

// gateLookup loads, in this process, a Caddy over the seeded store with two
// servers: the sandwake gate followed by a static response, and the static
// response alone. After loading every route once, it benchmarks requests to
// running sandboxes picked across the store, calling the provisioned gate
// handler directly (as caddymodule's BenchmarkGateHotPath does) and each
// server's handler chain. The Docker host is unreachable on purpose: the hot
// path never asks Docker, and the records stay as seeded.
func gateLookup(s *seededStore, tmp string) (gateCost, error) {
	var gc gateCost
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"storage": map[string]any{"module": "file_system", "root": filepath.Join(tmp, "caddy")},
		"apps": map[string]any{
			"sandwake": map[string]any{
				"storage": s.dir, "docker_host": "unix://" + filepath.Join(tmp, "no-docker.sock"),
				"idle_pause": 0, "idle_stop": 0, "max_resident": 0, "min_free_memory": "0",
				// Background loops out of the way: this measures lookups.
				"reap_interval": "1h", "reconcile_interval": "1h", "activity_flush": "1h",
			},
			"http": map[string]any{"servers": map[string]any{
				"gate":  server(map[string]any{"handler": "sandwake"}),
				"plain": server(),
			}},
		},
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return gc, err
	}
	if err := caddy.Load(js, true); err != nil {
		return gc, fmt.Errorf("loading in-process caddy: %w", err)
	}
	defer caddy.Stop()
	app, err := caddy.ActiveContext().App("http")
	if err != nil {
		return gc, err
	}
	servers := app.(*caddyhttp.App).Servers
	gateSrv, plainSrv := servers["gate"], servers["plain"]
	gate := gateSrv.Routes[0].Handlers[0]

	w := &nullWriter{h: http.Header{}}
	serve := func(srv http.Handler, r *http.Request) int {
		clear(w.h)
		w.status = 200
		srv.ServeHTTP(w, r)
		return w.status
	}
	// Every route once, through the gate (the status path answers without
	// proxying), so that the route cache holds the whole store.
	for i := range s.n {
		r := httptest.NewRequest("GET", fmt.Sprintf("http://s-sb%05d-8080.preview.localhost/.well-known/sandwake/status", i), nil)
		if code := serve(gateSrv, r); code != 200 {
			return gc, fmt.Errorf("status of sb%05d through the in-process gate: %d", i, code)
		}
	}
	chainReqs := make([]*http.Request, len(s.running))
	gateReqs := make([]*http.Request, len(s.running))
	for i, id := range s.running {
		url := "http://s-" + id + "-8080.preview.localhost/"
		chainReqs[i] = httptest.NewRequest("GET", url, nil)
		if code := serve(gateSrv, chainReqs[i]); code != 200 {
			return gc, fmt.Errorf("request to running %s through the in-process gate: %d", id, code)
		}
		// What the server hands its handlers: a replacer and the vars.
		r := httptest.NewRequest("GET", url, nil)
		ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer())
		gateReqs[i] = r.WithContext(context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{}))
	}
	var passed int
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { passed++; return nil })
	if err := gate.ServeHTTP(w, gateReqs[0], next); err != nil || passed != 1 {
		return gc, fmt.Errorf("the gate did not pass a running sandbox's request on: %v", err)
	}
	// A stride through the running ids, so that consecutive requests hit
	// different routes.
	const stride = 7919
	lookup := func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			clear(w.h)
			gate.ServeHTTP(w, gateReqs[i], next)
			i = (i + stride) % len(gateReqs)
		}
	}
	chain := func(srv http.Handler) func(*testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				serve(srv, chainReqs[i])
				i = (i + stride) % len(chainReqs)
			}
		}
	}
	// Alternated, three times each, keeping the fastest run of each.
	var l, c, p []testing.BenchmarkResult
	for range 3 {
		l = append(l, testing.Benchmark(lookup))
		c = append(c, testing.Benchmark(chain(gateSrv)))
		p = append(p, testing.Benchmark(chain(plainSrv)))
	}
	best := func(rs []testing.BenchmarkResult) (float64, int64) {
		b := rs[0]
		for _, r := range rs[1:] {
			if r.NsPerOp() < b.NsPerOp() {
				b = r
			}
		}
		return float64(b.T.Nanoseconds()) / float64(b.N), b.AllocsPerOp()
	}
	gc.lookupNs, gc.lookupAllocs = best(l)
	gc.chainNs, gc.chainAllocs = best(c)
	gc.plainNs, _ = best(p)
	return gc, nil
}

// server is the JSON of an HTTP server on a free loopback port whose only
// route runs handlers and then a static 200 "ok".
func server(handlers ...map[string]any) map[string]any {
	port, _ := freePort()
	hs := make([]any, 0, len(handlers)+1)
	for _, h := range handlers {
		hs = append(hs, h)
	}
	hs = append(hs, map[string]any{"handler": "static_response", "status_code": 200, "body": "ok"})
	return map[string]any{
		"listen":          []string{fmt.Sprintf("127.0.0.1:%d", port)},
		"automatic_https": map[string]any{"disable": true},
		"routes":          []any{map[string]any{"handle": hs}},
	}
}

// gatewayMemory starts the built Caddy over store dir (empty when n is 0),
// requests every sandbox's status once (its route and activity loaded), and
// returns the process's RSS and Go heap in use after a collection. Docker is
// unreachable on purpose, so that the seeded records stay as they are.
func gatewayMemory(ctx context.Context, bin, dir string, storage string, n int) (rss, anon, heap int64, err error) {
	g, err := newGateway(bin, dir, true)
	if err != nil {
		return 0, 0, 0, err
	}
	if storage != "" {
		g.storage = storage
	}
	g.extra = fmt.Sprintf("docker_host unix://%s\n\t\tmax_resident 0\n\t\tmin_free_memory 0", filepath.Join(dir, "no-docker.sock"))
	c := loopbackClient(8)
	status := func(id string) int {
		req, _ := http.NewRequestWithContext(ctx, "GET", g.previewURL(id, "/.well-known/sandwake/status"), nil)
		resp, err := c.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if err := g.start(ctx, func() bool { return status("nosuch") == 404 }); err != nil {
		return 0, 0, 0, err
	}
	defer g.stop()
	var (
		wg     sync.WaitGroup
		next   atomic.Int64
		failed atomic.Int64
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				if status(fmt.Sprintf("sb%05d", i)) != 200 {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		return 0, 0, 0, fmt.Errorf("%d of %d status requests failed", failed.Load(), n)
	}
	if heap, err = g.heapInUse(ctx); err != nil {
		return 0, 0, 0, err
	}
	if rss, err = g.rss(); err != nil {
		return 0, 0, 0, err
	}
	anon, err = g.rssAnon()
	return rss, anon, heap, err
}

// scaleRecords runs the records part of the scale scenario: seeded stores of
// small (the baseline) and large records.
func scaleRecords(ctx context.Context, bin, tmp string, small, large int) (*table, error) {
	t := &table{
		title: fmt.Sprintf("Scale: %s records (baseline: %s)", groupThousands(int64(large)), groupThousands(int64(small))),
		note:  "Badger on disk; reaper and reconcile against an engine listing matching containers; gate in process through Caddy's handler chain; memory of the built Caddy (Docker unreachable, records as seeded)",
	}
	stores := map[int]*seededStore{}
	for _, n := range []int{small, large} {
		t0 := time.Now()
		s, err := seedStore(filepath.Join(tmp, fmt.Sprintf("store-%d", n)), n)
		if err != nil {
			return t, fmt.Errorf("seeding %d records: %w", n, err)
		}
		stores[n] = s
		progress("scale: seeded %d records in %s", n, fmtDuration(time.Since(t0)))
		if ctx.Err() != nil {
			return t, ctx.Err()
		}
	}

	type costs struct {
		reap, reapResident, boot time.Duration
		gate                     gateCost
	}
	var c [2]costs
	for i, n := range []int{small, large} {
		var err error
		if c[i].reap, c[i].reapResident, c[i].boot, err = engineCosts(stores[n], 5, 3); err != nil {
			return t, err
		}
		if c[i].gate, err = gateLookup(stores[n], filepath.Join(tmp, fmt.Sprintf("inproc-%d", n))); err != nil {
			return t, err
		}
		progress("scale: %d records: reaper pass %s, boot %s, gate lookup %s/request", n, fmtDuration(c[i].reap), fmtDuration(c[i].boot), fmtNanos(c[i].gate.lookupNs))
		if ctx.Err() != nil {
			return t, ctx.Err()
		}
	}
	perRecord := func(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / float64(n) }
	t.add(ratioRow("gate lookup (gate handler, running sandbox)", c[0].gate.lookupNs, c[1].gate.lookupNs, fmtNanos, info))
	t.add(ratioRow("gate lookup, allocations per request", float64(c[0].gate.lookupAllocs), float64(c[1].gate.lookupAllocs), fmtCount, info))
	t.add(ratioRow("Caddy handler chain, gate + static response", c[0].gate.chainNs, c[1].gate.chainNs, fmtNanos, info))
	t.add(ratioRow("Caddy handler chain, static response alone", c[0].gate.plainNs, c[1].gate.plainNs, fmtNanos, info))
	t.add(ratioRow("reaper pass, nothing due", c[0].reap.Seconds(), c[1].reap.Seconds(), fmtSeconds, info))
	t.add(ratioRow("reaper pass, per record", perRecord(c[0].reap, small), perRecord(c[1].reap, large), fmtNanos, info))
	t.add(ratioRow("reaper pass over running + paused only (5 of 6 loop passes; a quarter of the records here)", c[0].reapResident.Seconds(), c[1].reapResident.Seconds(), fmtSeconds, info))
	t.add(ratioRow("boot: load records + full reconcile", c[0].boot.Seconds(), c[1].boot.Seconds(), fmtSeconds, info))
	t.add(ratioRow("boot, per record", perRecord(c[0].boot, small), perRecord(c[1].boot, large), fmtNanos, info))

	// Memory: the gateway over an empty store vs over the large one.
	rss0, anon0, heap0, err := gatewayMemory(ctx, bin, filepath.Join(tmp, "mem-empty"), "", 0)
	if err != nil {
		return t, fmt.Errorf("memory, empty store: %w", err)
	}
	rss1, anon1, heap1, err := gatewayMemory(ctx, bin, filepath.Join(tmp, "mem-large"), stores[large].dir, large)
	if err != nil {
		return t, fmt.Errorf("memory, %d records: %w", large, err)
	}
	progress("scale: gateway RSS %s empty, %s with %d records", fmtBytes(float64(rss0)), fmtBytes(float64(rss1)), large)
	t.add(ratioRow(fmt.Sprintf("gateway RSS: empty store vs %s records, all routes loaded", groupThousands(int64(large))), float64(rss0), float64(rss1), fmtBytes, info))
	t.add(ratioRow("gateway anonymous RSS (without mapped store files)", float64(anon0), float64(anon1), fmtBytes, info))
	t.add(ratioRow("gateway Go heap in use after GC", float64(heap0), float64(heap1), fmtBytes, info))
	t.add(valueRow("memory per sandbox (RSS delta / records)", "", float64(rss1-rss0)/float64(large), fmtBytes, atMost(2048)))
	t.add(valueRow("memory per sandbox (anonymous RSS delta / records)", "", float64(anon1-anon0)/float64(large), fmtBytes, info))
	t.add(valueRow("memory per sandbox (heap delta / records)", "", float64(heap1-heap0)/float64(large), fmtBytes, info))
	for _, s := range stores {
		os.RemoveAll(s.dir)
	}
	return t, nil
}
