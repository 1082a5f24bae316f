package lifecycle_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"

	"github.com/sandwake/sandwake/lifecycle/lifecycletest"

	"github.com/sandwake/sandwake/store"
)

// testEnv is a Manager over an in-memory store and a fake runtime whose
// containers answer HTTP on a loopback test server.
type testEnv struct {
	m     *lifecycle.Manager
	st    *store.Store
	rt    *lifecycletest.Runtime
	srv   *httptest.Server
	hooks *testHooks
}

// testHooks lets a test add event and wake hooks after the manager is
// built: the manager's own hooks (Config) are fixed at construction and
// call these, under a lock, so adding one never races with the loops.
type testHooks struct {
	mu     sync.Mutex
	events []func(lifecycle.Event)
	wakes  []func(lifecycle.WakeResult)
}

func (h *testHooks) onEvent(fn func(lifecycle.Event)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, fn)
}

func (h *testHooks) onWake(fn func(lifecycle.WakeResult)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wakes = append(h.wakes, fn)
}

func (h *testHooks) event(ev lifecycle.Event) {
	h.mu.Lock()
	fns := slices.Clone(h.events)
	h.mu.Unlock()
	for _, fn := range fns {
		fn(ev)
	}
}

func (h *testHooks) wake(w lifecycle.WakeResult) {
	h.mu.Lock()
	fns := slices.Clone(h.wakes)
	h.mu.Unlock()
	for _, fn := range fns {
		fn(w)
	}
}

// testPort is the container port every test spec declares.
const testPort = lifecycle.TestPort

// testClock is the fixed time of the fake clock.
var testClock = time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)

// testSpec and closedAddr are shared with the internal tests.
var (
	testSpec   = lifecycle.SampleSpec
	closedAddr = lifecycle.ClosedAddr
)

// newTestEnv returns a Manager with cfg (its clock fixed at testClock unless
// cfg.Now is set), closed at the end of the test.
func newTestEnv(t *testing.T, cfg lifecycle.Config) *testEnv {
	t.Helper()
	return newTestEnvWith(t, cfg, nil)
}

// newTestEnvWith is newTestEnv for tests and benchmarks, with the manager
// driving wrap(fake) instead of the fake itself when wrap is not nil (to give
// the fake more interfaces, such as EventSource).
func newTestEnvWith(tb testing.TB, cfg lifecycle.Config, wrap func(*lifecycletest.Runtime) lifecycle.Runtime) *testEnv {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	tb.Cleanup(srv.Close)
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return testClock }
	}
	st, err := store.Open(store.Options{InMemory: true, Now: cfg.Now})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	rt := lifecycletest.NewRuntime(map[int]string{testPort: srv.Listener.Addr().String()})
	var engine lifecycle.Runtime = rt
	if wrap != nil {
		engine = wrap(rt)
	}
	hooks := new(testHooks)
	if cfg.OnEvent == nil {
		cfg.OnEvent = hooks.event
	}
	if cfg.OnWake == nil {
		cfg.OnWake = hooks.wake
	}
	m, err := lifecycle.NewManager(st, engine, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	if err := m.Start(); err != nil {
		tb.Fatal(err)
	}
	return &testEnv{m: m, st: st, rt: rt, srv: srv, hooks: hooks}
}

// fakeClock is a clock the test moves by hand. It starts at testClock, so
// records made by seed are as old as the clock has been moved.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(testClock.UnixNano())
	return c
}

// Now is the clock's reading; pass it as Config.Now.
func (c *fakeClock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// at sets the clock to d after testClock.
func (c *fakeClock) at(d time.Duration) { c.ns.Store(testClock.Add(d).UnixNano()) }

// newClockEnv is newTestEnv with a movable clock (cfg.Now is replaced).
func newClockEnv(t *testing.T, cfg lifecycle.Config) (*testEnv, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	cfg.Now = clock.Now
	return newTestEnv(t, cfg), clock
}

// containerFor is the container state the engine holds for a sandbox in s.
func containerFor(s lifecycle.State) lifecycle.ContainerState {
	switch s {
	case lifecycle.Running:
		return lifecycle.ContainerRunning
	case lifecycle.Paused:
		return lifecycle.ContainerPaused
	case lifecycle.Stopped, lifecycle.Error:
		return lifecycle.ContainerExited
	case lifecycle.Creating:
		return lifecycle.ContainerCreated
	default: // killed, expired: no container
		return ""
	}
}

// seed stores sandbox id in state s, as the manager would have left it, and
// gives the fake engine the matching container. It resets no call counts.
func (e *testEnv) seed(t *testing.T, id string, s lifecycle.State) lifecycle.Record {
	t.Helper()
	return e.seedWith(t, id, s, nil)
}

// seedWith is seed with the record changed by mutate (when not nil) before
// it is stored: per-sandbox overrides, keepalives, timestamps.
func (e *testEnv) seedWith(t *testing.T, id string, s lifecycle.State, mutate func(*lifecycle.Record)) lifecycle.Record {
	t.Helper()
	spec := testSpec()
	if err := lifecycle.NormalizeSpec(&spec); err != nil {
		t.Fatal(err)
	}
	rec := lifecycle.Record{ID: id, Spec: spec, State: s, CreatedAt: testClock, LastActiveAt: testClock, StateSince: testClock}
	if lifecycle.Resident(s) {
		rec.ContainerID = "seeded-" + id
		rec.Upstreams = map[int]string{testPort: e.srv.Listener.Addr().String()}
	}
	if mutate != nil {
		mutate(&rec)
	}
	rec, _, err := e.st.Create(rec, "seed")
	if err != nil {
		t.Fatal(err)
	}
	e.m.SetState(id, s)
	e.rt.Put(id, containerFor(s))
	return rec
}

// state returns the stored state of id ("" when there is no record).
func (e *testEnv) state(t *testing.T, id string) lifecycle.State {
	t.Helper()
	rec, err := e.m.Get(id)
	if errors.Is(err, lifecycle.ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec.State
}

// history returns the events of id, oldest first.
func (e *testEnv) history(t *testing.T, id string) []lifecycle.Event {
	t.Helper()
	evs, err := e.m.History(id)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// waitFor polls cond until it holds, failing the test if it does not within a
// generous bound. The bound only stops a broken test; nothing is asserted on
// how long the wait took.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// receive returns the next value of ch, failing the test if none comes within
// a generous bound.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

var _ lifecycle.Runtime = (*lifecycletest.Runtime)(nil)
