package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"

	"github.com/sandwake/sandwake/lifecycle/lifecycletest"

	"github.com/sandwake/sandwake/store"
)

// newStoreFullEnv is newTestEnv over a store whose free space the test sets
// (free, in bytes; the reserve is 64 MiB); checks counts the store's
// free-space readings.
func newStoreFullEnv(t *testing.T, cfg lifecycle.Config) (e *testEnv, free, checks *atomic.Int64) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	cfg.Now = func() time.Time { return testClock }
	free, checks = new(atomic.Int64), new(atomic.Int64)
	free.Store(1 << 30)
	st, err := store.Open(store.Options{InMemory: true, Now: cfg.Now, MinFreeBytes: 64 << 20,
		FreeBytes: func() (int64, error) { checks.Add(1); return free.Load(), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt := lifecycletest.NewRuntime(map[int]string{testPort: srv.Listener.Addr().String()})
	m, err := lifecycle.NewManager(st, rt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &testEnv{m: m, st: st, rt: rt, srv: srv}, free, checks
}

// TestStoreFullRecordsLater: an operation whose engine work succeeded but
// whose transition the full store refused answers ErrStoreUnavailable,
// saying what the engine did; the record stays as last committed; once
// space is back the sandbox is re-read and recorded without any further
// call, and the retry loop ends.
func TestStoreFullRecordsLater(t *testing.T) {
	tests := []struct {
		name          string
		from          lifecycle.State
		op            func(m *lifecycle.Manager, id string) error
		says          string
		wantContainer lifecycle.ContainerState
		want          lifecycle.State
	}{
		{"stop", lifecycle.Running, func(m *lifecycle.Manager, id string) error {
			_, err := m.Stop(context.Background(), id, "api")
			return err
		},
			"the container was stopped, but the store could not record it", lifecycle.ContainerExited, lifecycle.Stopped},
		{"pause", lifecycle.Running, func(m *lifecycle.Manager, id string) error {
			_, err := m.Pause(context.Background(), id, "api")
			return err
		},
			"the container was paused, but the store could not record it", lifecycle.ContainerPaused, lifecycle.Paused},
		{"stop of a paused sandbox", lifecycle.Paused, func(m *lifecycle.Manager, id string) error {
			_, err := m.Stop(context.Background(), id, "api")
			return err
		},
			"the container was stopped", lifecycle.ContainerExited, lifecycle.Stopped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, free, _ := newStoreFullEnv(t, lifecycle.Config{StoreRetry: 5 * time.Millisecond})
			e.seed(t, "sf1", tt.from)
			free.Store(1 << 20)

			err := tt.op(e.m, "sf1")
			if !errors.Is(err, lifecycle.ErrStoreUnavailable) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("%s with the store full: %v; want ErrStoreUnavailable saying %q", tt.name, err, tt.says)
			}
			if got := e.rt.ContainerState("sf1"); got != tt.wantContainer {
				t.Fatalf("engine after %s: container %s, want %s", tt.name, got, tt.wantContainer)
			}
			if got := e.state(t, "sf1"); got != tt.from {
				t.Fatalf("record while the store is full: %s, want %s as last committed", got, tt.from)
			}
			if e.m.Unrecorded() != 1 {
				t.Fatalf("%d sandboxes noted unrecorded, want 1", e.m.Unrecorded())
			}

			free.Store(1 << 30)
			waitFor(t, "the record to follow the engine", func() bool { return e.state(t, "sf1") == tt.want })
			waitFor(t, "the retry loop to end", e.m.UnrecordedSettled)
		})
	}
}

// TestStoreFullStaysUnrecorded: while the store stays full, the sandbox stays
// noted however often the loop looks, and the engine is not asked again
// (the loop checks the store first).
func TestStoreFullStaysUnrecorded(t *testing.T) {
	e, free, checks := newStoreFullEnv(t, lifecycle.Config{StoreRetry: time.Millisecond})
	e.seed(t, "sf2", lifecycle.Running)
	free.Store(1 << 20)
	if _, err := e.m.Stop(context.Background(), "sf2", "api"); !errors.Is(err, lifecycle.ErrStoreUnavailable) {
		t.Fatalf("stop with the store full: %v", err)
	}
	inspects := e.rt.Count("Inspect")
	// Let the loop look at the store 50 times: it must neither drop the
	// sandbox nor ask the engine while the store refuses.
	seen := checks.Load()
	waitFor(t, "50 rounds of the retry loop", func() bool { return checks.Load() >= seen+50 })
	if e.m.Unrecorded() != 1 || e.rt.Count("Inspect") != inspects {
		t.Fatalf("while full: %d unrecorded (want 1), %d inspects since the stop (want 0)", e.m.Unrecorded(), e.rt.Count("Inspect")-inspects)
	}
	free.Store(1 << 30)
	waitFor(t, "the record to follow the engine", func() bool { return e.state(t, "sf2") == lifecycle.Stopped })
	if h := e.history(t, "sf2"); h[len(h)-1].Reason != "exited(0)" {
		t.Fatalf("last event %+v, want the reconcile's exited correction", h[len(h)-1])
	}
}

// TestStoreFullRefusesWake: a wake while the store refuses writes fails with
// ErrStoreUnavailable before the engine is touched, so no container runs
// behind a record that says it is stopped.
func TestStoreFullRefusesWake(t *testing.T) {
	e, free, _ := newStoreFullEnv(t, lifecycle.Config{StoreRetry: 5 * time.Millisecond})
	e.seed(t, "sf3", lifecycle.Stopped)
	e.rt.ResetCalls()
	free.Store(1 << 20)
	_, err := e.m.Wake(context.Background(), "sf3")
	if !errors.Is(err, lifecycle.ErrStoreUnavailable) || !strings.Contains(err.Error(), "no space left (1 MiB free, reserve 64 MiB)") {
		t.Fatalf("wake with the store full: %v; want ErrStoreUnavailable naming the shortage", err)
	}
	wantCalls(t, e.rt, map[string]int{})
	free.Store(1 << 30)
	if _, err := e.m.Wake(context.Background(), "sf3"); err != nil {
		t.Fatalf("wake once space is back: %v", err)
	}
	if got := e.state(t, "sf3"); got != lifecycle.Running {
		t.Fatalf("after the wake: %s", got)
	}
}

// TestStoreFullDestroy: a destroy whose record the full store cannot delete
// says the container is gone and that the DELETE must be sent again; sent
// again once space is back, it deletes the record.
func TestStoreFullDestroy(t *testing.T) {
	e, free, _ := newStoreFullEnv(t, lifecycle.Config{StoreRetry: 5 * time.Millisecond})
	e.seed(t, "sf4", lifecycle.Running)
	free.Store(1 << 20)
	err := e.m.Destroy(context.Background(), "sf4", "api")
	if !errors.Is(err, lifecycle.ErrStoreUnavailable) || !strings.Contains(err.Error(), "the container was removed, but the store could not delete the record") ||
		!strings.Contains(err.Error(), "send the DELETE again") {
		t.Fatalf("destroy with the store full: %v", err)
	}
	if got := e.rt.ContainerState("sf4"); got != "" {
		t.Fatalf("container after the destroy: %s, want none", got)
	}
	free.Store(1 << 30)
	if err := e.m.Destroy(context.Background(), "sf4", "api"); err != nil {
		t.Fatalf("destroy sent again once space is back: %v", err)
	}
	if got := e.state(t, "sf4"); got != "" {
		t.Fatalf("record after the second destroy: %s, want none", got)
	}
}

// landedStore is a store whose Create writes the record and then reports
// the store unavailable, as Badger does when it applied a write but could
// not sync its log.
type landedStore struct{ lifecycle.Store }

func (s landedStore) Create(r lifecycle.Record, reason string) (lifecycle.Record, lifecycle.Event, error) {
	rec, ev, err := s.Store.Create(r, reason)
	if err != nil {
		return rec, ev, err
	}
	return rec, ev, fmt.Errorf("%w: log sync failed after the write", lifecycle.ErrStoreUnavailable)
}

// TestCreateWhoseWriteLandedIsRecorded: a create whose record write reported
// a failure yet landed answers the failure, and the record is read again
// once the store takes writes: left creating with no create running, it
// becomes error, and the state mirror knows it (without the re-read it
// stayed creating for good, unseen by the reconcile, which decides on the
// mirror).
func TestCreateWhoseWriteLandedIsRecorded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	cfg := lifecycle.Config{Now: func() time.Time { return testClock }, StoreRetry: 5 * time.Millisecond}
	st, err := store.Open(store.Options{InMemory: true, Now: cfg.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt := lifecycletest.NewRuntime(map[int]string{testPort: srv.Listener.Addr().String()})
	m, err := lifecycle.NewManager(landedStore{st}, rt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })

	if _, err := m.Create(context.Background(), lifecycle.CreateRequest{ID: "landed", Spec: testSpec()}); !errors.Is(err, lifecycle.ErrStoreUnavailable) {
		t.Fatalf("create over a store that failed after writing: %v, want ErrStoreUnavailable", err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		rec, err := st.Get("landed")
		if err != nil {
			return false, err.Error()
		}
		c := m.Counts()
		return rec.State == lifecycle.Error && c[lifecycle.Error] == 1 && m.Unrecorded() == 0,
			fmt.Sprintf("record %s, mirror %v, %d unrecorded", rec.State, c, m.Unrecorded())
	})
}
