package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/store"
)

// fakeRuntime is an in-memory Runtime. It keeps a container per sandbox id
// with the state a real engine would report, records how often each method
// was called, fails the methods it is told to and can hold calls at a gate so
// that a test controls when an operation in flight completes.
type fakeRuntime struct {
	mu         sync.Mutex
	calls      map[string]int
	containers map[string]*Container
	volumes    map[string]int64
	fails      map[string]error
	gates      map[string]*gate
	upstreams  map[int]string
	created    int
}

// fakeVolumeBytes is what every fake volume reports as freed on removal.
const fakeVolumeBytes = 4096

func newFakeRuntime(upstreams map[int]string) *fakeRuntime {
	return &fakeRuntime{
		calls:      make(map[string]int),
		containers: make(map[string]*Container),
		volumes:    make(map[string]int64),
		fails:      make(map[string]error),
		gates:      make(map[string]*gate),
		upstreams:  upstreams,
	}
}

// gate holds the calls that reach it until it is released.
type gate struct {
	// entered receives one value per call that reached the gate.
	entered chan string
	open    chan struct{}
	once    sync.Once
}

// release lets every held call (and every later one) through. Safe to call
// more than once.
func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// hold makes calls of method for sandbox id (any sandbox when id is "") wait
// at the returned gate. The gate is released at the end of the test, before
// the manager is closed, so a failing test never hangs.
func (f *fakeRuntime) hold(t *testing.T, method, id string) *gate {
	t.Helper()
	g := &gate{entered: make(chan string, 1024), open: make(chan struct{})}
	f.mu.Lock()
	f.gates[method+"/"+id] = g
	f.mu.Unlock()
	t.Cleanup(g.release)
	return g
}

// failWith makes every later call of method fail with err (nil: succeed again).
func (f *fakeRuntime) failWith(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fails, method)
		return
	}
	f.fails[method] = err
}

// setUpstreams changes the addresses returned by later starts.
func (f *fakeRuntime) setUpstreams(u map[int]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.upstreams = u
}

// put gives sandbox id a container in state s and a volume, as if it had been
// made earlier; state "" removes the container (the volume stays).
func (f *fakeRuntime) put(id string, s ContainerState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.volumes[id] = fakeVolumeBytes
	if s == "" {
		delete(f.containers, id)
		return
	}
	f.created++
	f.containers[id] = &Container{ID: fmt.Sprintf("c%d", f.created), SandboxID: id, State: s, Upstreams: maps.Clone(f.upstreams)}
}

// edit changes sandbox id's container in place (exit code, upstreams, …) as
// the engine would see it change behind sandwake's back.
func (f *fakeRuntime) edit(id string, fn func(*Container)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.containers[id]; c != nil {
		fn(c)
	}
}

// containerState is what the fake engine holds for id ("" when no container).
func (f *fakeRuntime) containerState(id string) ContainerState {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.containers[id]; c != nil {
		return c.State
	}
	return ""
}

func (f *fakeRuntime) hasVolume(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.volumes[id]
	return ok
}

// count returns how often method was called.
func (f *fakeRuntime) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// snapshot returns the call counts of every method called at least once.
func (f *fakeRuntime) snapshot() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.calls)
}

// resetCalls forgets the calls made so far (after a test's setup).
func (f *fakeRuntime) resetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.calls)
}

// enter counts a call of method for id, waits at its gate if there is one and
// returns the error the method is told to fail with.
func (f *fakeRuntime) enter(method, id string) error {
	f.mu.Lock()
	f.calls[method]++
	g := f.gates[method+"/"+id]
	if g == nil {
		g = f.gates[method+"/"]
	}
	f.mu.Unlock()
	if g != nil {
		g.entered <- id
		// The gate ignores ctx on purpose: a held call ends only when the
		// test says so, which makes "Close waits for the wake" observable.
		<-g.open
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fails[method]
}

func notFound(id string) error {
	return fmt.Errorf("container of sandbox %s: %w", id, ErrContainerNotFound)
}

func (f *fakeRuntime) Create(ctx context.Context, id string, spec store.Spec) (Container, error) {
	if err := f.enter("Create", id); err != nil {
		return Container{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.volumes[id]; !ok {
		f.volumes[id] = fakeVolumeBytes
	}
	f.created++
	c := &Container{ID: fmt.Sprintf("c%d", f.created), SandboxID: id, State: ContainerCreated}
	f.containers[id] = c
	return *c, nil
}

func (f *fakeRuntime) Start(ctx context.Context, id string) (Container, error) {
	if err := f.enter("Start", id); err != nil {
		return Container{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[id]
	switch {
	case c == nil:
		return Container{}, notFound(id)
	case c.State == ContainerPaused:
		return Container{}, fmt.Errorf("cannot start a paused container, try unpause instead")
	}
	c.State = ContainerRunning
	c.StartedAt = time.Now()
	c.Upstreams = maps.Clone(f.upstreams)
	out := *c
	out.Upstreams = maps.Clone(c.Upstreams)
	return out, nil
}

// setContainerState moves an existing container to s, or fails as Docker does.
func (f *fakeRuntime) setContainerState(method, id string, from []ContainerState, to ContainerState) error {
	if err := f.enter(method, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[id]
	if c == nil {
		return notFound(id)
	}
	ok := false
	for _, s := range from {
		ok = ok || c.State == s
	}
	if !ok {
		return fmt.Errorf("container %s is %s", c.ID, c.State)
	}
	c.State = to
	return nil
}

func (f *fakeRuntime) Pause(ctx context.Context, id string) error {
	return f.setContainerState("Pause", id, []ContainerState{ContainerRunning}, ContainerPaused)
}

func (f *fakeRuntime) Unpause(ctx context.Context, id string) error {
	return f.setContainerState("Unpause", id, []ContainerState{ContainerPaused}, ContainerRunning)
}

func (f *fakeRuntime) Stop(ctx context.Context, id string) error {
	return f.setContainerState("Stop", id, []ContainerState{ContainerRunning, ContainerPaused, ContainerCreated, ContainerExited, ContainerDead}, ContainerExited)
}

func (f *fakeRuntime) Remove(ctx context.Context, id string) error {
	if err := f.enter("Remove", id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.containers, id)
	return nil
}

func (f *fakeRuntime) RemoveVolume(ctx context.Context, id string) (int64, error) {
	if err := f.enter("RemoveVolume", id); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.volumes[id]
	if !ok {
		return 0, fmt.Errorf("volume of sandbox %s: %w", id, ErrNotFound)
	}
	delete(f.volumes, id)
	return n, nil
}

func (f *fakeRuntime) Inspect(ctx context.Context, id string) (Container, error) {
	if err := f.enter("Inspect", id); err != nil {
		return Container{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[id]
	if c == nil {
		return Container{}, notFound(id)
	}
	out := *c
	out.Upstreams = maps.Clone(c.Upstreams)
	return out, nil
}

func (f *fakeRuntime) List(ctx context.Context) ([]Container, error) {
	if err := f.enter("List", ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Container, 0, len(f.containers))
	for _, c := range f.containers {
		cc := *c
		cc.Upstreams = maps.Clone(c.Upstreams)
		out = append(out, cc)
	}
	return out, nil
}

func (f *fakeRuntime) Ping(ctx context.Context) error { return f.enter("Ping", "") }

// testEnv is a Manager over an in-memory store and a fake runtime whose
// containers answer HTTP on a loopback test server.
type testEnv struct {
	m     *Manager
	st    *store.Store
	rt    *fakeRuntime
	srv   *httptest.Server
	hooks *testHooks
}

// testHooks lets a test add event and wake hooks after the manager is
// built: the manager's own hooks (Config) are fixed at construction and
// call these, under a lock, so adding one never races with the loops.
type testHooks struct {
	mu     sync.Mutex
	events []func(Event)
	wakes  []func(WakeResult)
}

func (h *testHooks) onEvent(fn func(Event)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, fn)
}

func (h *testHooks) onWake(fn func(WakeResult)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wakes = append(h.wakes, fn)
}

func (h *testHooks) event(ev Event) {
	h.mu.Lock()
	fns := slices.Clone(h.events)
	h.mu.Unlock()
	for _, fn := range fns {
		fn(ev)
	}
}

func (h *testHooks) wake(w WakeResult) {
	h.mu.Lock()
	fns := slices.Clone(h.wakes)
	h.mu.Unlock()
	for _, fn := range fns {
		fn(w)
	}
}

// testPort is the container port every test spec declares.
const testPort = 8080

// testClock is the fixed time of the fake clock.
var testClock = time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)

func testSpec() Spec {
	return Spec{Image: "sandwake/testapp:1", Ports: []int{testPort}}
}

// newTestEnv returns a Manager with cfg (its clock fixed at testClock unless
// cfg.Now is set), closed at the end of the test.
func newTestEnv(t *testing.T, cfg Config) *testEnv {
	t.Helper()
	return newTestEnvWith(t, cfg, nil)
}

// newTestEnvWith is newTestEnv for tests and benchmarks, with the manager
// driving wrap(fake) instead of the fake itself when wrap is not nil (to give
// the fake more interfaces, such as EventSource).
func newTestEnvWith(tb testing.TB, cfg Config, wrap func(*fakeRuntime) Runtime) *testEnv {
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
	rt := newFakeRuntime(map[int]string{testPort: srv.Listener.Addr().String()})
	var engine Runtime = rt
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
	m, err := NewManager(st, engine, cfg)
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
func newClockEnv(t *testing.T, cfg Config) (*testEnv, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	cfg.Now = clock.Now
	return newTestEnv(t, cfg), clock
}

// containerFor is the container state the engine holds for a sandbox in s.
func containerFor(s State) ContainerState {
	switch s {
	case Running:
		return ContainerRunning
	case Paused:
		return ContainerPaused
	case Stopped, Error:
		return ContainerExited
	case Creating:
		return ContainerCreated
	default: // killed, expired: no container
		return ""
	}
}

// seed stores sandbox id in state s, as the manager would have left it, and
// gives the fake engine the matching container. It resets no call counts.
func (e *testEnv) seed(t *testing.T, id string, s State) Record {
	t.Helper()
	return e.seedWith(t, id, s, nil)
}

// seedWith is seed with the record changed by mutate (when not nil) before
// it is stored: per-sandbox overrides, keepalives, timestamps.
func (e *testEnv) seedWith(t *testing.T, id string, s State, mutate func(*Record)) Record {
	t.Helper()
	spec := testSpec()
	if err := NormalizeSpec(&spec); err != nil {
		t.Fatal(err)
	}
	rec := Record{ID: id, Spec: spec, State: s, CreatedAt: testClock, LastActiveAt: testClock, StateSince: testClock}
	if Resident(s) {
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
	e.m.setState(id, s)
	e.rt.put(id, containerFor(s))
	return rec
}

// state returns the stored state of id ("" when there is no record).
func (e *testEnv) state(t *testing.T, id string) State {
	t.Helper()
	rec, err := e.m.Get(id)
	if errors.Is(err, ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec.State
}

// history returns the events of id, oldest first.
func (e *testEnv) history(t *testing.T, id string) []Event {
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

var _ Runtime = (*fakeRuntime)(nil)
