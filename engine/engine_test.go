package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
	"github.com/sandwake/sandwake/store"
)

// open opens an engine with opts, closed at the end of the test.
func open(t *testing.T, opts engine.Options) *engine.Engine {
	t.Helper()
	e, err := engine.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestOpenInstance: a new store keeps the configured instance name, or draws
// one; a reopened store keeps its name and refuses another.
func TestOpenInstance(t *testing.T) {
	tests := []struct {
		name       string
		configured string
		reopenWith string
		want       string // "" : drawn ("gw-…")
		wantErr    error
	}{
		{"configured", "blue", "", "blue", nil},
		{"configured twice", "blue", "blue", "blue", nil},
		{"drawn", "", "", "", nil},
		{"renamed", "blue", "green", "", store.ErrInstanceMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			rt := lifecycletest.NewRuntime(nil)
			first, err := engine.Open(engine.Options{Dir: dir, Instance: tt.configured, Runtime: rt})
			if err != nil {
				t.Fatal(err)
			}
			if !first.Fresh() {
				t.Fatal("a new store is not fresh")
			}
			kept := first.Instance
			if err := first.Close(); err != nil {
				t.Fatal(err)
			}
			second, err := engine.Open(engine.Options{Dir: dir, Instance: tt.reopenWith, Runtime: rt})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), dir) {
					t.Fatalf("reopened as %q: %v, want %v naming %s", tt.reopenWith, err, tt.wantErr, dir)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer second.Close()
			if second.Fresh() {
				t.Fatal("a reopened store is fresh")
			}
			if second.Instance != kept {
				t.Fatalf("instance %q after reopening, %q before", second.Instance, kept)
			}
			if tt.want == "" && !strings.HasPrefix(kept, "gw-") || tt.want != "" && kept != tt.want {
				t.Fatalf("instance %q, want %q", kept, tt.want)
			}
		})
	}
}

// TestOpenBuildsUnstartedManager: the Manager is built over the store and
// the given runtime but not started: nothing is called until the caller
// starts it, and the records stored before are known at once.
func TestOpenBuildsUnstartedManager(t *testing.T) {
	dir := t.TempDir()
	rt := lifecycletest.NewRuntime(nil)
	seed := open(t, engine.Options{Dir: dir, Runtime: rt})
	spec := lifecycle.Spec{Image: "x", Ports: []int{8080}}
	if err := lifecycle.NormalizeSpec(&spec); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if _, _, err := seed.Store().Create(lifecycle.Record{ID: "a1", Spec: spec, State: lifecycle.Running,
		CreatedAt: now, StateSince: now, LastActiveAt: now}, "seed"); err != nil {
		t.Fatal(err)
	}
	if err := seed.Close(); err != nil {
		t.Fatal(err)
	}

	e := open(t, engine.Options{Dir: dir, Runtime: rt, Manager: lifecycle.Config{
		ReconcileInterval: time.Millisecond, ReapInterval: time.Millisecond, WatchEvents: true,
	}})
	if cpus, mem := e.HostSize(); cpus != 0 || mem != 0 {
		t.Fatalf("host size %d CPUs %d MiB without Docker, want zeros", cpus, mem)
	}
	if e.Dir() != dir {
		t.Fatalf("dir %q, want %q", e.Dir(), dir)
	}
	if resident, _ := e.Manager.Resident(); resident != 1 {
		t.Fatalf("%d resident before start, want 1 (the stored record)", resident)
	}
	if calls := rt.Calls(); len(calls) != 0 {
		t.Fatalf("the runtime was called before Start: %v", calls)
	}
	if err := e.Manager.Start(); err != nil {
		t.Fatal(err)
	}
	// The periodic reconcile lists the engine: the loops run once started.
	deadline := time.Now().Add(10 * time.Second)
	for rt.Count("List") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no reconcile after Start")
		}
		time.Sleep(time.Millisecond)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFreshStoreKeepsOrphans: over a new store, containers of the instance
// that have no record are not removed even with orphans remove, and the
// engine says the store looks lost; over the same store reopened, they are
// removed.
func TestFreshStoreKeepsOrphans(t *testing.T) {
	dir := t.TempDir()
	rt := lifecycletest.NewRuntime(nil)
	rt.Put("lost1", lifecycle.ContainerExited)
	rt.Put("lost2", lifecycle.ContainerRunning)
	cfg := lifecycle.Config{OrphansRemove: true}
	ctx := context.Background()

	e := open(t, engine.Options{Dir: dir, Runtime: rt, Manager: cfg})
	stats, err := e.Manager.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats.Orphans) != 2 || rt.ContainerState("lost1") == "" || rt.ContainerState("lost2") == "" {
		t.Fatalf("orphans %v; containers %q %q: want both counted and kept", stats.Orphans, rt.ContainerState("lost1"), rt.ContainerState("lost2"))
	}
	warning := e.StoreWarning(stats)
	if !strings.Contains(warning, dir) || !strings.Contains(warning, "2 containers") || !strings.Contains(warning, e.Instance) {
		t.Fatalf("store warning %q, want it to name %s, 2 containers and instance %s", warning, dir, e.Instance)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e = open(t, engine.Options{Dir: dir, Runtime: rt, Manager: cfg})
	stats, err = e.Manager.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if w := e.StoreWarning(stats); w != "" {
		t.Fatalf("store warning over a reopened store: %q", w)
	}
	if rt.ContainerState("lost1") != "" || rt.ContainerState("lost2") != "" {
		t.Fatalf("orphans left over a reopened store with orphans remove: %q %q", rt.ContainerState("lost1"), rt.ContainerState("lost2"))
	}
}

// TestOpenInMemory: an in-memory engine has no directory and closes cleanly.
func TestOpenInMemory(t *testing.T) {
	e := open(t, engine.Options{InMemory: true, Runtime: lifecycletest.NewRuntime(nil)})
	if e.Dir() != "" || !e.Fresh() {
		t.Fatalf("in memory: dir %q, fresh %v", e.Dir(), e.Fresh())
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}
