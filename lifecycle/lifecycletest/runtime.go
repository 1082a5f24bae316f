package lifecycletest

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// Runtime is an in-memory lifecycle.Runtime. It keeps a container per
// sandbox id with the state a real engine would report, records how often
// each method was called, fails the methods it is told to and can hold calls
// at a gate so that a test controls when an operation in flight completes.
// All methods are safe for concurrent use.
type Runtime struct {
	mu         sync.Mutex
	calls      map[string]int
	containers map[string]*lifecycle.Container
	volumes    map[string]int64
	fails      map[string]error
	gates      map[string]*Gate
	upstreams  map[int]string
	created    int
}

// VolumeBytes is what every fake volume reports as freed on removal.
const VolumeBytes = 4096

// NewRuntime returns an empty engine whose started containers answer at
// upstreams (port to address; a loopback test server in most tests).
func NewRuntime(upstreams map[int]string) *Runtime {
	return &Runtime{
		calls:      make(map[string]int),
		containers: make(map[string]*lifecycle.Container),
		volumes:    make(map[string]int64),
		fails:      make(map[string]error),
		gates:      make(map[string]*Gate),
		upstreams:  upstreams,
	}
}

// Gate holds the calls that reach it until it is released (see Hold).
type Gate struct {
	// Entered receives the sandbox id of every call that reached the gate.
	Entered chan string
	open    chan struct{}
	once    sync.Once
}

// Release lets every held call (and every later one) through. Safe to call
// more than once.
func (g *Gate) Release() { g.once.Do(func() { close(g.open) }) }

// Hold makes calls of method (a Runtime method name such as "Start") for sandbox id (any sandbox when id is "") wait
// at the returned gate. The gate is released at the end of the test, before
// the manager is closed (cleanups run last-registered first), so a failing
// test never hangs.
func (f *Runtime) Hold(t testing.TB, method, id string) *Gate {
	t.Helper()
	g := &Gate{Entered: make(chan string, 1024), open: make(chan struct{})}
	f.mu.Lock()
	f.gates[method+"/"+id] = g
	f.mu.Unlock()
	t.Cleanup(g.Release)
	return g
}

// FailWith makes every later call of method fail with err (nil: succeed again).
func (f *Runtime) FailWith(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fails, method)
		return
	}
	f.fails[method] = err
}

// SetUpstreams changes the addresses returned by later starts.
func (f *Runtime) SetUpstreams(u map[int]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.upstreams = u
}

// Put gives sandbox id a container in state s and a volume, as if it had been
// made earlier; state "" removes the container (the volume stays).
func (f *Runtime) Put(id string, s lifecycle.ContainerState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.volumes[id] = VolumeBytes
	if s == "" {
		delete(f.containers, id)
		return
	}
	f.created++
	f.containers[id] = &lifecycle.Container{ID: fmt.Sprintf("c%d", f.created), SandboxID: id, State: s, Upstreams: maps.Clone(f.upstreams)}
}

// Edit changes sandbox id's container in place (exit code, upstreams, …) as
// the engine would see it change behind sandwake's back.
func (f *Runtime) Edit(id string, fn func(*lifecycle.Container)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.containers[id]; c != nil {
		fn(c)
	}
}

// ContainerState is what the fake engine holds for id ("" when no container).
func (f *Runtime) ContainerState(id string) lifecycle.ContainerState {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.containers[id]; c != nil {
		return c.State
	}
	return ""
}

// HasVolume reports whether sandbox id has a volume.
func (f *Runtime) HasVolume(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.volumes[id]
	return ok
}

// Count returns how often method was called.
func (f *Runtime) Count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Calls returns the call counts of every method called at least once.
func (f *Runtime) Calls() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.calls)
}

// ResetCalls forgets the calls made so far (after a test's setup).
func (f *Runtime) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.calls)
}

// enter counts a call of method for id, waits at its gate if there is one and
// returns the error the method is told to fail with.
func (f *Runtime) enter(method, id string) error {
	f.mu.Lock()
	f.calls[method]++
	g := f.gates[method+"/"+id]
	if g == nil {
		g = f.gates[method+"/"]
	}
	f.mu.Unlock()
	if g != nil {
		g.Entered <- id
		// The gate ignores ctx on purpose: a held call ends only when the
		// test says so, which makes "Close waits for the wake" observable.
		<-g.open
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fails[method]
}

func notFound(id string) error {
	return fmt.Errorf("container of sandbox %s: %w", id, lifecycle.ErrContainerNotFound)
}

// Create makes the container (state created) and the volume when missing.
func (f *Runtime) Create(ctx context.Context, id string, spec lifecycle.Spec) (lifecycle.Container, error) {
	if err := f.enter("Create", id); err != nil {
		return lifecycle.Container{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.volumes[id]; !ok {
		f.volumes[id] = VolumeBytes
	}
	f.created++
	c := &lifecycle.Container{ID: fmt.Sprintf("c%d", f.created), SandboxID: id, State: lifecycle.ContainerCreated}
	f.containers[id] = c
	return *c, nil
}

// Start runs the container, giving it the current upstreams.
func (f *Runtime) Start(ctx context.Context, id string) (lifecycle.Container, error) {
	if err := f.enter("Start", id); err != nil {
		return lifecycle.Container{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[id]
	switch {
	case c == nil:
		return lifecycle.Container{}, notFound(id)
	case c.State == lifecycle.ContainerPaused:
		return lifecycle.Container{}, fmt.Errorf("cannot start a paused container, try unpause instead")
	}
	c.State = lifecycle.ContainerRunning
	c.StartedAt = time.Now()
	c.Upstreams = maps.Clone(f.upstreams)
	out := *c
	out.Upstreams = maps.Clone(c.Upstreams)
	return out, nil
}

// setContainerState moves an existing container to s, or fails as Docker does.
func (f *Runtime) setContainerState(method, id string, from []lifecycle.ContainerState, to lifecycle.ContainerState) error {
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

// Pause freezes a running container.
func (f *Runtime) Pause(ctx context.Context, id string) error {
	return f.setContainerState("Pause", id, []lifecycle.ContainerState{lifecycle.ContainerRunning}, lifecycle.ContainerPaused)
}

// Unpause thaws a paused container.
func (f *Runtime) Unpause(ctx context.Context, id string) error {
	return f.setContainerState("Unpause", id, []lifecycle.ContainerState{lifecycle.ContainerPaused}, lifecycle.ContainerRunning)
}

// Stop makes the container exited.
func (f *Runtime) Stop(ctx context.Context, id string) error {
	return f.setContainerState("Stop", id, []lifecycle.ContainerState{lifecycle.ContainerRunning, lifecycle.ContainerPaused, lifecycle.ContainerCreated, lifecycle.ContainerExited, lifecycle.ContainerDead}, lifecycle.ContainerExited)
}

// Remove removes the container, keeping the volume.
func (f *Runtime) Remove(ctx context.Context, id string) error {
	if err := f.enter("Remove", id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.containers, id)
	return nil
}

// RemoveVolume removes the volume and reports VolumeBytes freed.
func (f *Runtime) RemoveVolume(ctx context.Context, id string) (int64, error) {
	if err := f.enter("RemoveVolume", id); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.volumes[id]
	if !ok {
		return 0, fmt.Errorf("volume of sandbox %s: %w", id, lifecycle.ErrNotFound)
	}
	delete(f.volumes, id)
	return n, nil
}

// VolumeOwner implements lifecycle.VolumeInspector: whether the volume
// exists; it records no owner of its own (the store does).
func (f *Runtime) VolumeOwner(ctx context.Context, id string) (lifecycle.VolumeOwner, bool, bool, error) {
	if err := f.enter("VolumeOwner", id); err != nil {
		return lifecycle.VolumeOwner{}, false, false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.volumes[id]
	return lifecycle.VolumeOwner{}, false, ok, nil
}

// Inspect returns a copy of the container.
func (f *Runtime) Inspect(ctx context.Context, id string) (lifecycle.Container, error) {
	if err := f.enter("Inspect", id); err != nil {
		return lifecycle.Container{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.containers[id]
	if c == nil {
		return lifecycle.Container{}, notFound(id)
	}
	out := *c
	out.Upstreams = maps.Clone(c.Upstreams)
	return out, nil
}

// List returns copies of every container.
func (f *Runtime) List(ctx context.Context) ([]lifecycle.Container, error) {
	if err := f.enter("List", ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]lifecycle.Container, 0, len(f.containers))
	for _, c := range f.containers {
		cc := *c
		cc.Upstreams = maps.Clone(c.Upstreams)
		out = append(out, cc)
	}
	return out, nil
}

// Ping answers unless told to fail.
func (f *Runtime) Ping(ctx context.Context) error { return f.enter("Ping", "") }

// Interface guard.
var _ lifecycle.Runtime = (*Runtime)(nil)
