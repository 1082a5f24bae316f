package lifecycle_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
	"github.com/sandwake/sandwake/store"
)

// preloadedRuntime is the fake engine whose event stream hands out pending
// events the moment the manager subscribes, without waiting for the test:
// what a daemon reports about containers that died while the gateway was
// down. delivered is closed once every pending event was taken.
type preloadedRuntime struct {
	*lifecycletest.Runtime
	pending   []lifecycle.RuntimeEvent
	once      sync.Once
	delivered chan struct{}
}

func (r *preloadedRuntime) Events(ctx context.Context) (<-chan lifecycle.RuntimeEvent, <-chan error) {
	evs := make(chan lifecycle.RuntimeEvent)
	r.once.Do(func() {
		go func() {
			for _, ev := range r.pending {
				select {
				case evs <- ev:
				case <-ctx.Done():
					return
				}
			}
			close(r.delivered)
		}()
	})
	return evs, make(chan error)
}

var _ lifecycle.EventSource = (*preloadedRuntime)(nil)

// TestStartRacesEngineEvents: engine events already pending when the
// manager starts are delivered while Start runs and while a wake, called
// concurrently with Start, is in flight. Every sandbox they name is
// reconciled through the hooks fixed at construction (go test -race checks
// that nothing races), and the wake is unaffected.
func TestStartRacesEngineEvents(t *testing.T) {
	const dead = 20
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt := &preloadedRuntime{
		Runtime:   lifecycletest.NewRuntime(map[int]string{testPort: srv.Listener.Addr().String()}),
		delivered: make(chan struct{}),
	}
	spec := testSpec()
	if err := lifecycle.NormalizeSpec(&spec); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	seed := func(id string, s lifecycle.State) {
		rec := lifecycle.Record{ID: id, Spec: spec, State: s, CreatedAt: now, LastActiveAt: now, StateSince: now}
		if s == lifecycle.Running {
			rec.ContainerID = "seeded-" + id
			rec.Upstreams = map[int]string{testPort: srv.Listener.Addr().String()}
		}
		if _, _, err := st.Create(rec, "seed"); err != nil {
			t.Fatal(err)
		}
	}
	// Recorded running, but their containers are gone: each is reported
	// twice (die, destroy), as Docker does.
	for i := range dead {
		id := fmt.Sprintf("dead%d", i)
		seed(id, lifecycle.Running)
		rt.Put(id, "")
		rt.pending = append(rt.pending, lifecycle.RuntimeEvent{SandboxID: id, Action: "die"}, lifecycle.RuntimeEvent{SandboxID: id, Action: "destroy"})
	}
	seed("sleeper", lifecycle.Stopped)
	rt.Put("sleeper", lifecycle.ContainerExited)

	var changes, events, wakes atomic.Int32
	m, err := lifecycle.NewManager(st, rt, lifecycle.Config{
		WatchEvents: true, ReapInterval: time.Millisecond, ActivityFlush: time.Millisecond,
		// No periodic reconcile: only the events can find the dead.
		OnChange: func(string) { changes.Add(1) },
		OnEvent:  func(lifecycle.Event) { events.Add(1) },
		OnWake:   func(lifecycle.WakeResult) { wakes.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })

	var wg sync.WaitGroup
	var startErr, wakeErr error
	wg.Go(func() { startErr = m.Start() })
	wg.Go(func() { _, wakeErr = m.Wake(context.Background(), "sleeper") })
	wg.Wait()
	if startErr != nil || wakeErr != nil {
		t.Fatalf("Start: %v; wake: %v", startErr, wakeErr)
	}
	receive(t, rt.delivered, "every pending event to be taken")
	for i := range dead {
		id := fmt.Sprintf("dead%d", i)
		waitFor(t, id+" to be killed", func() bool {
			rec, err := m.Get(id)
			return err == nil && rec.State == lifecycle.Killed
		})
	}
	if rec, err := m.Get("sleeper"); err != nil || rec.State != lifecycle.Running {
		t.Fatalf("sleeper: %+v, %v; want running", rec, err)
	}
	// The resident count follows each transition just after its commit,
	// so a record read as killed may be counted a moment longer.
	waitFor(t, "1 resident (the sleeper; the dead are killed)", func() bool {
		resident, _ := m.Resident()
		return resident == 1
	})
	// Hooks: one event and one change per kill and for the wake; one wake.
	if events.Load() < dead+1 || changes.Load() < dead+1 || wakes.Load() != 1 {
		t.Fatalf("hooks saw %d events, %d changes, %d wakes; want at least %d, %d and exactly 1",
			events.Load(), changes.Load(), wakes.Load(), dead+1, dead+1)
	}
}
