package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"

	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
)

// corrections collects what Config.OnReconcile receives.
type corrections struct {
	mu   sync.Mutex
	list []lifecycle.Correction
}

func (c *corrections) note(x lifecycle.Correction) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.list = append(c.list, x)
}

func (c *corrections) all() []lifecycle.Correction {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.list)
}

// reconcileEnv is a test env with a movable clock whose corrections are
// collected.
func reconcileEnv(t *testing.T, cfg lifecycle.Config) (*testEnv, *fakeClock, *corrections) {
	t.Helper()
	got := new(corrections)
	cfg.OnReconcile = got.note
	e, clock := newClockEnv(t, cfg)
	return e, clock, got
}

// answeringAddr returns the address of a new loopback HTTP server that
// answers every request, closed at the end of the test.
func answeringAddr(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func TestReconcile(t *testing.T) {
	tests := []struct {
		name      string
		state     lifecycle.State
		container lifecycle.ContainerState // "" : no container
		edit      func(*lifecycle.Container)
		at        time.Duration // clock when reconciling
		want      lifecycle.State
		kind      string // "" : no correction
		reason    string
		// moved: the container's port moved (a start outside sandwake) to
		// an address that answers, and the record must adopt it; silent:
		// to one where nothing answers yet.
		moved, silent bool
	}{
		{name: "running, container missing", state: lifecycle.Running, want: lifecycle.Killed, kind: lifecycle.CorrectionMissing, reason: "container_missing"},
		{name: "paused, container missing", state: lifecycle.Paused, want: lifecycle.Killed, kind: lifecycle.CorrectionMissing, reason: "container_missing"},
		{name: "stopped, container missing", state: lifecycle.Stopped, want: lifecycle.Killed, kind: lifecycle.CorrectionMissing, reason: "container_missing"},
		{name: "running, exited(3)", state: lifecycle.Running, container: lifecycle.ContainerExited, edit: func(c *lifecycle.Container) { c.ExitCode = 3 },
			want: lifecycle.Stopped, kind: lifecycle.CorrectionExited, reason: "exited(3)"},
		{name: "running, OOM-killed", state: lifecycle.Running, container: lifecycle.ContainerExited, edit: func(c *lifecycle.Container) { c.ExitCode, c.OOMKilled = 137, true },
			want: lifecycle.Stopped, kind: lifecycle.CorrectionOOM, reason: "oom"},
		{name: "running, dead", state: lifecycle.Running, container: lifecycle.ContainerDead, edit: func(c *lifecycle.Container) { c.ExitCode = 1 },
			want: lifecycle.Stopped, kind: lifecycle.CorrectionExited, reason: "exited(1)"},
		// A container paused before a daemon or host restart comes back exited.
		{name: "paused, exited", state: lifecycle.Paused, container: lifecycle.ContainerExited,
			want: lifecycle.Stopped, kind: lifecycle.CorrectionExited, reason: "exited(0)"},
		{name: "running, paused outside", state: lifecycle.Running, container: lifecycle.ContainerPaused,
			want: lifecycle.Paused, kind: lifecycle.CorrectionPaused, reason: "paused_outside"},
		{name: "stopped, started and paused outside", state: lifecycle.Stopped, container: lifecycle.ContainerPaused,
			want: lifecycle.Paused, kind: lifecycle.CorrectionPaused, reason: "paused_outside"},
		{name: "paused, unpaused outside", state: lifecycle.Paused, container: lifecycle.ContainerRunning,
			want: lifecycle.Running, kind: lifecycle.CorrectionRunning, reason: "started_outside", moved: true},
		{name: "stopped, started outside", state: lifecycle.Stopped, container: lifecycle.ContainerRunning,
			want: lifecycle.Running, kind: lifecycle.CorrectionRunning, reason: "started_outside", moved: true},
		{name: "killed, started outside", state: lifecycle.Killed, container: lifecycle.ContainerRunning,
			want: lifecycle.Running, kind: lifecycle.CorrectionRunning, reason: "started_outside", moved: true},
		{name: "error, started outside", state: lifecycle.Error, container: lifecycle.ContainerRunning,
			want: lifecycle.Running, kind: lifecycle.CorrectionRunning, reason: "started_outside", moved: true},
		// A running container is adopted only once its port answers (a
		// wake cut short by a crash may have started it before the app
		// listens); the next wake waits for readiness instead.
		{name: "stopped, started outside, not listening yet", state: lifecycle.Stopped, container: lifecycle.ContainerRunning, silent: true, want: lifecycle.Stopped},
		{name: "killed, started outside, not listening yet", state: lifecycle.Killed, container: lifecycle.ContainerRunning, silent: true, want: lifecycle.Killed},
		// Create holds the lock for its whole run: a creating record seen
		// under its lock is a create that died with an earlier process,
		// however young (see TestReconcileSkipsHeld for one in flight).
		{name: "creating, a second old", state: lifecycle.Creating, container: lifecycle.ContainerCreated,
			want: lifecycle.Error, kind: lifecycle.CorrectionStuckCreating, reason: "stuck_creating"},
		{name: "creating without a container, an hour old", state: lifecycle.Creating, at: time.Hour,
			want: lifecycle.Error, kind: lifecycle.CorrectionStuckCreating, reason: "stuck_creating"},
		{name: "running, running", state: lifecycle.Running, container: lifecycle.ContainerRunning, want: lifecycle.Running},
		{name: "paused, paused", state: lifecycle.Paused, container: lifecycle.ContainerPaused, want: lifecycle.Paused},
		{name: "stopped, exited", state: lifecycle.Stopped, container: lifecycle.ContainerExited, want: lifecycle.Stopped},
		{name: "stopped, created", state: lifecycle.Stopped, container: lifecycle.ContainerCreated, want: lifecycle.Stopped},
		{name: "error, exited", state: lifecycle.Error, container: lifecycle.ContainerExited, want: lifecycle.Error},
		{name: "killed, no container", state: lifecycle.Killed, want: lifecycle.Killed},
		{name: "expired, no container", state: lifecycle.Expired, want: lifecycle.Expired},
		{name: "error, no container", state: lifecycle.Error, want: lifecycle.Error},
		{name: "running, restarting", state: lifecycle.Running, container: lifecycle.ContainerRestarting, want: lifecycle.Running},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, clock, got := reconcileEnv(t, lifecycle.Config{})
			e.seed(t, "app1", tt.state)
			var moved map[int]string
			switch {
			case tt.moved:
				moved = map[int]string{testPort: answeringAddr(t)}
			case tt.silent:
				moved = map[int]string{testPort: closedAddr(t)}
			}
			if moved != nil {
				e.rt.SetUpstreams(moved)
			}
			e.rt.Put("app1", tt.container)
			if tt.edit != nil {
				e.rt.Edit("app1", tt.edit)
			}
			e.rt.ResetCalls()
			// Reconcile a second after the seed unless told otherwise, so
			// that the times it records are its own.
			clock.at(time.Second)
			if tt.at > 0 {
				clock.at(tt.at)
			}
			if !e.m.LastReconcile().IsZero() {
				t.Fatal("LastReconcile set before any reconcile")
			}
			stats, err := e.m.Reconcile(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if stats.Records != 1 || len(stats.Orphans) != 0 {
				t.Fatalf("stats = %+v", stats)
			}
			if tt.container != "" && stats.Containers != 1 {
				t.Fatalf("stats = %+v, want one container", stats)
			}
			if !e.m.LastReconcile().Equal(clock.Now()) {
				t.Fatalf("LastReconcile = %v, want %v", e.m.LastReconcile(), clock.Now())
			}
			if e.rt.Count("List") != 1 || e.rt.Count("Start")+e.rt.Count("Stop")+e.rt.Count("Remove")+e.rt.Count("Create") != 0 {
				t.Fatalf("runtime calls = %v: reconcile only looks", e.rt.Calls())
			}
			rec, err := e.m.Get("app1")
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != tt.want {
				t.Fatalf("state = %s, want %s", rec.State, tt.want)
			}
			if tt.kind == "" {
				if len(got.all()) != 0 || len(stats.Corrections) != 0 || len(e.history(t, "app1")) != 1 {
					t.Fatalf("corrections %v, stats %v for a consistent sandbox", got.all(), stats.Corrections)
				}
				return
			}
			want := lifecycle.Correction{ID: "app1", Kind: tt.kind, From: tt.state, To: tt.want, Reason: tt.reason}
			if c := got.all(); len(c) != 1 || c[0] != want {
				t.Fatalf("OnReconcile got %+v, want %+v", c, want)
			}
			if !maps.Equal(stats.Corrections, map[string]int{tt.kind: 1}) {
				t.Fatalf("stats corrections = %v", stats.Corrections)
			}
			evs := e.history(t, "app1")
			if last := evs[len(evs)-1]; len(evs) != 2 || last.From != tt.state || last.To != tt.want || last.Reason != tt.reason {
				t.Fatalf("events = %+v", evs)
			}
			if rec.Reason != tt.reason || !rec.VerifiedAt.Equal(clock.Now()) {
				t.Fatalf("record = %+v", rec)
			}
			switch tt.want {
			case lifecycle.Killed:
				if rec.ContainerID != "" || rec.Upstreams != nil {
					t.Fatalf("killed record keeps container %q, upstreams %v", rec.ContainerID, rec.Upstreams)
				}
			case lifecycle.Stopped:
				if !rec.StoppedAt.Equal(clock.Now()) {
					t.Fatalf("stopped at %v", rec.StoppedAt)
				}
			case lifecycle.Error:
				if rec.Error == "" {
					t.Fatal("error record without an error text")
				}
			}
			if tt.moved {
				c, _ := e.rt.Inspect(context.Background(), "app1")
				if rec.ContainerID != c.ID || !maps.Equal(rec.Upstreams, moved) || rec.Error != "" {
					t.Fatalf("record = %+v, want container %s with upstreams %v adopted", rec, c.ID, moved)
				}
			}
			if res, _ := e.m.Resident(); res != btoi(lifecycle.Resident(tt.want)) {
				t.Fatalf("resident = %d after reconcile to %s", res, tt.want)
			}
			// Once corrected, the next reconcile finds nothing to do.
			stats, err = e.m.Reconcile(context.Background())
			if err != nil || len(stats.Corrections) != 0 {
				t.Fatalf("second reconcile: %v, %v", stats.Corrections, err)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestReconcileOne(t *testing.T) {
	t.Run("upstreams changed", func(t *testing.T) {
		e, clock, got := reconcileEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		movedUpstreams := map[int]string{testPort: answeringAddr(t)}
		e.rt.Edit("app1", func(c *lifecycle.Container) { c.Upstreams = maps.Clone(movedUpstreams) })
		clock.at(time.Minute)
		c, err := e.m.ReconcileOne(context.Background(), "app1")
		if err != nil {
			t.Fatal(err)
		}
		want := lifecycle.Correction{ID: "app1", Kind: lifecycle.CorrectionUpstream, From: lifecycle.Running, To: lifecycle.Running, Reason: "upstream_changed"}
		if c == nil || *c != want {
			t.Fatalf("correction = %+v, want %+v", c, want)
		}
		if g := got.all(); len(g) != 1 || g[0] != want {
			t.Fatalf("OnReconcile got %+v", g)
		}
		rec, _ := e.m.Get("app1")
		if !maps.Equal(rec.Upstreams, movedUpstreams) || rec.State != lifecycle.Running || !rec.StateSince.Equal(testClock) {
			t.Fatalf("record = %+v", rec)
		}
		evs := e.history(t, "app1")
		if len(evs) != 2 || evs[1].From != lifecycle.Running || evs[1].To != lifecycle.Running || evs[1].Reason != "upstream_changed" {
			t.Fatalf("events = %+v", evs)
		}
		wantCalls(t, e.rt, map[string]int{"Inspect": 1})
		if res, _ := e.m.Resident(); res != 1 {
			t.Fatalf("resident = %d, want 1", res)
		}
	})

	t.Run("nothing changed", func(t *testing.T) {
		e, _, got := reconcileEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		c, err := e.m.ReconcileOne(context.Background(), "app1")
		if err != nil || c != nil || len(got.all()) != 0 || len(e.history(t, "app1")) != 1 {
			t.Fatalf("correction %+v, %v", c, err)
		}
	})

	t.Run("died", func(t *testing.T) {
		e, _, _ := reconcileEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		e.rt.Put("app1", lifecycle.ContainerExited)
		e.rt.Edit("app1", func(c *lifecycle.Container) { c.ExitCode = 2 })
		c, err := e.m.ReconcileOne(context.Background(), "app1")
		if err != nil || c == nil || c.Kind != lifecycle.CorrectionExited || c.Reason != "exited(2)" {
			t.Fatalf("correction %+v, %v", c, err)
		}
	})

	t.Run("no record", func(t *testing.T) {
		e, _, _ := reconcileEnv(t, lifecycle.Config{})
		e.rt.Put("ghost", lifecycle.ContainerRunning)
		if c, err := e.m.ReconcileOne(context.Background(), "ghost"); err != nil || c != nil {
			t.Fatalf("correction %+v, %v", c, err)
		}
	})

	t.Run("engine unavailable", func(t *testing.T) {
		e, _, _ := reconcileEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		e.rt.FailWith("Inspect", fmt.Errorf("docker: %w", lifecycle.ErrUnavailable))
		if _, err := e.m.ReconcileOne(context.Background(), "app1"); !errors.Is(err, lifecycle.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if got := e.state(t, "app1"); got != lifecycle.Running {
			t.Fatalf("state = %s, want running", got)
		}
	})
}

func TestReconcileOrphans(t *testing.T) {
	for _, remove := range []bool{false, true} {
		t.Run(fmt.Sprintf("remove=%v", remove), func(t *testing.T) {
			e, _, got := reconcileEnv(t, lifecycle.Config{OrphansRemove: remove})
			e.seed(t, "app1", lifecycle.Running)
			e.rt.Put("ghost2", lifecycle.ContainerExited)
			e.rt.Put("ghost1", lifecycle.ContainerRunning)
			// A container without the sandbox label is not sandwake's.
			e.rt.Put("foreign", lifecycle.ContainerRunning)
			e.rt.Edit("foreign", func(c *lifecycle.Container) { c.SandboxID = "" })
			e.rt.ResetCalls()
			stats, err := e.m.Reconcile(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(stats.Orphans, []string{"ghost1", "ghost2"}) || stats.Records != 1 || stats.Containers != 4 {
				t.Fatalf("stats = %+v", stats)
			}
			if !remove {
				wantCalls(t, e.rt, map[string]int{"List": 1})
				if len(stats.Corrections) != 0 || len(got.all()) != 0 {
					t.Fatalf("corrections %v / %v without orphans remove", stats.Corrections, got.all())
				}
				for _, id := range []string{"ghost1", "ghost2", "foreign"} {
					if e.rt.ContainerState(id) == "" {
						t.Fatalf("%s removed without orphans remove", id)
					}
				}
				return
			}
			wantCalls(t, e.rt, map[string]int{"List": 1, "Remove": 2})
			if !maps.Equal(stats.Corrections, map[string]int{lifecycle.CorrectionOrphanRemoved: 2}) {
				t.Fatalf("corrections = %v", stats.Corrections)
			}
			want := []lifecycle.Correction{{ID: "ghost1", Kind: lifecycle.CorrectionOrphanRemoved}, {ID: "ghost2", Kind: lifecycle.CorrectionOrphanRemoved}}
			if g := got.all(); !slices.Equal(g, want) {
				t.Fatalf("OnReconcile got %+v, want %+v", g, want)
			}
			for id, want := range map[string]lifecycle.ContainerState{"ghost1": "", "ghost2": "", "foreign": lifecycle.ContainerRunning, "app1": lifecycle.ContainerRunning} {
				if got := e.rt.ContainerState(id); got != want {
					t.Fatalf("container of %s is %q, want %q", id, got, want)
				}
			}
			if got := e.state(t, "app1"); got != lifecycle.Running {
				t.Fatalf("app1 is %s", got)
			}
		})
	}
}

func TestReconcileFailure(t *testing.T) {
	t.Run("list unavailable", func(t *testing.T) {
		e, _, got := reconcileEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		e.rt.Put("app1", "") // would be killed
		e.rt.FailWith("List", fmt.Errorf("docker: %w", lifecycle.ErrUnavailable))
		if _, err := e.m.Reconcile(context.Background()); !errors.Is(err, lifecycle.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if s := e.state(t, "app1"); s != lifecycle.Running || len(got.all()) != 0 {
			t.Fatalf("state %s, corrections %v after a failed reconcile", s, got.all())
		}
		if !e.m.LastReconcile().IsZero() {
			t.Fatal("LastReconcile set by a failed reconcile")
		}
		wantCalls(t, e.rt, map[string]int{"List": 1})
	})

	t.Run("inspect unavailable", func(t *testing.T) {
		e, _, _ := reconcileEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		e.rt.Put("app1", lifecycle.ContainerExited)
		e.rt.FailWith("Inspect", fmt.Errorf("docker: %w", lifecycle.ErrUnavailable))
		if _, err := e.m.Reconcile(context.Background()); !errors.Is(err, lifecycle.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if s := e.state(t, "app1"); s != lifecycle.Running {
			t.Fatalf("state %s", s)
		}
		if !e.m.LastReconcile().IsZero() {
			t.Fatal("LastReconcile set by a failed reconcile")
		}
	})

	t.Run("last success kept", func(t *testing.T) {
		e, clock, _ := reconcileEnv(t, lifecycle.Config{})
		clock.at(time.Minute)
		if _, err := e.m.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
		clock.at(2 * time.Minute)
		e.rt.FailWith("List", fmt.Errorf("docker: %w", lifecycle.ErrUnavailable))
		if _, err := e.m.Reconcile(context.Background()); err == nil {
			t.Fatal("reconcile succeeded with the engine down")
		}
		if got := e.m.LastReconcile(); !got.Equal(testClock.Add(time.Minute)) {
			t.Fatalf("LastReconcile = %v, want the first one", got)
		}
	})
}

// TestReconcileSkipsHeld: a sandbox another operation holds is left to it.
func TestReconcileSkipsHeld(t *testing.T) {
	t.Run("create in flight", func(t *testing.T) {
		e, _, got := reconcileEnv(t, lifecycle.Config{})
		g := e.rt.Hold(t, "Start", "app1")
		done := make(chan error, 1)
		go func() {
			_, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app1", Spec: testSpec()})
			done <- err
		}()
		receive(t, g.Entered, "the start of the create")
		stats, err := e.m.Reconcile(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if s := e.state(t, "app1"); s != lifecycle.Creating || len(stats.Corrections) != 0 || len(stats.Orphans) != 0 || len(got.all()) != 0 {
			t.Fatalf("reconcile during a create: %s, %+v", s, stats)
		}
		g.Release()
		if err := receive(t, done, "the create"); err != nil {
			t.Fatal(err)
		}
		if s := e.state(t, "app1"); s != lifecycle.Running {
			t.Fatalf("created sandbox is %s", s)
		}
	})

	e, _, got := reconcileEnv(t, lifecycle.Config{})
	e.seed(t, "held", lifecycle.Running)
	e.seed(t, "free", lifecycle.Running)
	e.rt.Put("held", "")
	e.rt.Put("free", "")
	unlock := e.m.LockID("held")
	stats, err := e.m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if e.state(t, "held") != lifecycle.Running || e.state(t, "free") != lifecycle.Killed || stats.Corrections[lifecycle.CorrectionMissing] != 1 {
		t.Fatalf("held %s, free %s, corrections %v", e.state(t, "held"), e.state(t, "free"), stats.Corrections)
	}
	if len(stats.Orphans) != 0 {
		t.Fatalf("orphans = %v", stats.Orphans)
	}
	unlock()
	if _, err := e.m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := e.state(t, "held"); s != lifecycle.Killed || len(got.all()) != 2 {
		t.Fatalf("held is %s after release, corrections %v", s, got.all())
	}
}

// eventRuntime is the fake engine with an event stream. Each subscription is
// handed to the test through streams.
type eventRuntime struct {
	*lifecycletest.Runtime
	streams    chan *fakeStream
	subscribed atomic.Int32
}

type fakeStream struct {
	ctx  context.Context
	evs  chan lifecycle.RuntimeEvent
	errs chan error
}

func (r *eventRuntime) Events(ctx context.Context) (<-chan lifecycle.RuntimeEvent, <-chan error) {
	r.subscribed.Add(1)
	s := &fakeStream{ctx: ctx, evs: make(chan lifecycle.RuntimeEvent), errs: make(chan error, 1)}
	r.streams <- s
	return s.evs, s.errs
}

var _ lifecycle.EventSource = (*eventRuntime)(nil)

// send delivers ev on the stream; the manager must be reading it.
func (s *fakeStream) send(t *testing.T, ev lifecycle.RuntimeEvent) {
	t.Helper()
	select {
	case s.evs <- ev:
	case <-s.ctx.Done():
		t.Fatalf("stream ended before %+v was delivered", ev)
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out delivering %+v", ev)
	}
}

func eventsEnv(t *testing.T, cfg lifecycle.Config) (*testEnv, *eventRuntime) {
	t.Helper()
	var er *eventRuntime
	e := newTestEnvWith(t, cfg, func(f *lifecycletest.Runtime) lifecycle.Runtime {
		er = &eventRuntime{Runtime: f, streams: make(chan *fakeStream, 64)}
		return er
	})
	return e, er
}

func TestRuntimeEvents(t *testing.T) {
	tests := []struct {
		name      string
		state     lifecycle.State
		container lifecycle.ContainerState
		edit      func(*lifecycle.Container)
		action    string
		want      lifecycle.State
		reason    string
	}{
		{"die", lifecycle.Running, lifecycle.ContainerExited, func(c *lifecycle.Container) { c.ExitCode = 3 }, "die", lifecycle.Stopped, "exited(3)"},
		{"oom", lifecycle.Running, lifecycle.ContainerExited, func(c *lifecycle.Container) { c.ExitCode, c.OOMKilled = 137, true }, "oom", lifecycle.Stopped, "oom"},
		{"destroy", lifecycle.Stopped, "", nil, "destroy", lifecycle.Killed, "container_missing"},
		{"pause", lifecycle.Running, lifecycle.ContainerPaused, nil, "pause", lifecycle.Paused, "paused_outside"},
		{"unpause", lifecycle.Paused, lifecycle.ContainerRunning, nil, "unpause", lifecycle.Running, "started_outside"},
		{"start", lifecycle.Stopped, lifecycle.ContainerRunning, nil, "start", lifecycle.Running, "started_outside"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, er := eventsEnv(t, lifecycle.Config{WatchEvents: true})
			s := receive(t, er.streams, "the subscription")
			e.seed(t, "app1", tt.state)
			e.rt.Put("app1", tt.container)
			if tt.edit != nil {
				e.rt.Edit("app1", tt.edit)
			}
			s.send(t, lifecycle.RuntimeEvent{SandboxID: "app1", Action: tt.action})
			waitFor(t, "the event to be reconciled", func() bool { return e.state(t, "app1") == tt.want })
			if r := e.lastReason(t, "app1"); r != tt.reason {
				t.Fatalf("reason = %q, want %q", r, tt.reason)
			}
			if n := er.subscribed.Load(); n != 1 {
				t.Fatalf("%d subscriptions, want 1", n)
			}
		})
	}

	// Docker 20.10 on cgroup v2 may report the exit before the OOM kill,
	// with OOMKilled false: the die makes the sandbox exited(137), and the
	// late oom event, after which the runtime reports the exit OOM-killed
	// (lifecycle/docker keeps the report), gives it its true reason.
	t.Run("oom after die", func(t *testing.T) {
		e, er := eventsEnv(t, lifecycle.Config{WatchEvents: true})
		s := receive(t, er.streams, "the subscription")
		e.seed(t, "app1", lifecycle.Running)
		e.rt.Put("app1", lifecycle.ContainerExited)
		e.rt.Edit("app1", func(c *lifecycle.Container) { c.ExitCode = 137 })
		s.send(t, lifecycle.RuntimeEvent{SandboxID: "app1", Action: "die"})
		waitFor(t, "the die to be reconciled", func() bool { return e.state(t, "app1") == lifecycle.Stopped })
		if r := e.lastReason(t, "app1"); r != "exited(137)" {
			t.Fatalf("reason after die = %q, want exited(137)", r)
		}
		e.rt.Edit("app1", func(c *lifecycle.Container) { c.OOMKilled = true })
		s.send(t, lifecycle.RuntimeEvent{SandboxID: "app1", Action: "oom"})
		waitFor(t, "the oom to relabel the stop", func() bool {
			rec, err := e.m.Get("app1")
			return err == nil && rec.State == lifecycle.Stopped && rec.Reason == "oom"
		})
		// An exit of the same code without an OOM report is not one.
		e.seed(t, "app2", lifecycle.Running)
		e.rt.Put("app2", lifecycle.ContainerExited)
		e.rt.Edit("app2", func(c *lifecycle.Container) { c.ExitCode = 137 })
		s.send(t, lifecycle.RuntimeEvent{SandboxID: "app2", Action: "die"})
		waitFor(t, "app2's die to be reconciled", func() bool { return e.state(t, "app2") == lifecycle.Stopped })
		if rec, err := e.m.Get("app2"); err != nil || rec.Reason != "exited(137)" {
			t.Fatalf("app2 = %+v, %v; want exited(137)", rec.Reason, err)
		}
	})

	t.Run("ignored events", func(t *testing.T) {
		e, er := eventsEnv(t, lifecycle.Config{WatchEvents: true})
		s := receive(t, er.streams, "the subscription")
		e.seed(t, "app1", lifecycle.Running)
		e.rt.Put("app1", "")
		for _, id := range []string{"", "not-an-id", "nosuch"} {
			s.send(t, lifecycle.RuntimeEvent{SandboxID: id, Action: "die"})
		}
		s.send(t, lifecycle.RuntimeEvent{SandboxID: "app1", Action: "destroy"})
		waitFor(t, "app1 to be killed", func() bool { return e.state(t, "app1") == lifecycle.Killed })
		e.m.Close() // waits for every reconcile an event started
		// Invalid ids never reach the engine, nor does an id without a record.
		if n := e.rt.Count("Inspect"); n != 1 {
			t.Fatalf("%d inspects, want 1 (app1)", n)
		}
	})

	for _, brk := range []struct {
		name   string
		break_ func(s *fakeStream)
	}{
		{"error", func(s *fakeStream) { s.errs <- fmt.Errorf("reading events: %w", lifecycle.ErrUnavailable) }},
		{"errs closed", func(s *fakeStream) { close(s.errs) }},
		{"events closed", func(s *fakeStream) { close(s.evs) }},
	} {
		t.Run("stream breaks: "+brk.name, func(t *testing.T) {
			e, er := eventsEnv(t, lifecycle.Config{WatchEvents: true})
			s := receive(t, er.streams, "the subscription")
			// A change that no event reports, as if missed while the
			// stream was down.
			e.seed(t, "app1", lifecycle.Running)
			e.rt.Put("app1", "")
			brk.break_(s)
			s2 := receive(t, er.streams, "the second subscription")
			if n := er.subscribed.Load(); n != 2 {
				t.Fatalf("%d subscriptions, want 2", n)
			}
			if s.ctx.Err() == nil {
				t.Fatal("the broken subscription's context is still live")
			}
			// The full reconcile runs before the new subscription.
			if got := e.state(t, "app1"); got != lifecycle.Killed {
				t.Fatalf("app1 is %s after resubscribing, want killed by the full reconcile", got)
			}
			if e.m.LastReconcile().IsZero() {
				t.Fatal("no full reconcile after the stream broke")
			}
			// The new stream works.
			e.seed(t, "app2", lifecycle.Running)
			e.rt.Put("app2", lifecycle.ContainerPaused)
			s2.send(t, lifecycle.RuntimeEvent{SandboxID: "app2", Action: "pause"})
			waitFor(t, "app2 to be paused", func() bool { return e.state(t, "app2") == lifecycle.Paused })
		})
	}

	t.Run("not watched", func(t *testing.T) {
		e, er := eventsEnv(t, lifecycle.Config{})
		e.m.Close()
		if n := er.subscribed.Load(); n != 0 {
			t.Fatalf("%d subscriptions without WatchEvents", n)
		}
	})

	t.Run("close ends the subscription", func(t *testing.T) {
		e, er := eventsEnv(t, lifecycle.Config{WatchEvents: true})
		s := receive(t, er.streams, "the subscription")
		e.m.Close()
		if s.ctx.Err() == nil {
			t.Fatal("subscription context live after Close")
		}
	})
}

// TestEventFloodIsQueued: a burst of engine events (a daemon restart reports
// every container, a die comes with a destroy) costs at most two reconciles
// per sandbox and a bounded number of goroutines, not one per event.
func TestEventFloodIsQueued(t *testing.T) {
	e, er := eventsEnv(t, lifecycle.Config{WatchEvents: true})
	s := receive(t, er.streams, "the subscription")
	const sandboxes, perSandbox = 50, 20
	ids := make([]string, sandboxes)
	for i := range ids {
		ids[i] = fmt.Sprintf("app%d", i)
		e.seed(t, ids[i], lifecycle.Running)
		e.rt.Put(ids[i], "")
	}
	e.rt.ResetCalls()
	// Every inspect waits at the gate while the flood arrives: the workers
	// are busy, everything else is queued.
	g := e.rt.Hold(t, "Inspect", "")
	before := runtime.NumGoroutine()
	for range perSandbox {
		for _, id := range ids {
			s.send(t, lifecycle.RuntimeEvent{SandboxID: id, Action: "die"})
		}
	}
	if grown := runtime.NumGoroutine() - before; grown > 10 {
		t.Fatalf("%d goroutines more during a flood of %d events", grown, sandboxes*perSandbox)
	}
	if n := e.m.QueuedEvents(); n > sandboxes {
		t.Fatalf("%d ids queued for %d sandboxes", n, sandboxes)
	}
	g.Release()
	for _, id := range ids {
		waitFor(t, id+" to be killed", func() bool { return e.state(t, id) == lifecycle.Killed })
	}
	waitFor(t, "the queue to drain", func() bool { return e.m.QueuedEvents() == 0 })
	e.m.Close()
	// Each sandbox: one inspect, plus at most one more for the worker that
	// held it when its later events came (they may report something newer).
	if n := e.rt.Count("Inspect"); n < sandboxes || n > 2*sandboxes {
		t.Fatalf("%d inspects for %d events over %d sandboxes; want %d to %d", n, sandboxes*perSandbox, sandboxes, sandboxes, 2*sandboxes)
	}
}

// TestEventsDuringStartup: engine events arrive the moment the manager
// starts; the hooks they call are part of the manager's configuration, so
// nothing registers them while the loops run (go test -race checks it).
func TestEventsDuringStartup(t *testing.T) {
	var changes, events atomic.Int32
	e, er := eventsEnv(t, lifecycle.Config{
		WatchEvents: true, ReapInterval: time.Millisecond, ActivityFlush: time.Millisecond, ReconcileInterval: time.Millisecond,
		OnChange: func(string) { changes.Add(1) },
		OnEvent:  func(lifecycle.Event) { events.Add(1) },
	})
	s := receive(t, er.streams, "the subscription")
	for i := range 20 {
		id := fmt.Sprintf("app%d", i)
		e.seed(t, id, lifecycle.Running)
		e.rt.Put(id, "")
		s.send(t, lifecycle.RuntimeEvent{SandboxID: id, Action: "destroy"})
	}
	for i := range 20 {
		id := fmt.Sprintf("app%d", i)
		waitFor(t, id+" to be killed", func() bool { return e.state(t, id) == lifecycle.Killed })
	}
	if changes.Load() < 40 || events.Load() < 40 {
		t.Fatalf("hooks saw %d changes and %d events, want at least 40 each (20 seeds, 20 kills)", changes.Load(), events.Load())
	}
	if err := e.m.Start(); err != nil {
		t.Fatalf("a second Start: %v", err)
	}
	e.m.Close()
	if err := e.m.Start(); !errors.Is(err, lifecycle.ErrClosed) {
		t.Fatalf("Start after Close: %v, want ErrClosed", err)
	}
}

// countingStore counts the reads a Manager makes of its store.
type countingStore struct {
	lifecycle.Store
	gets, lists atomic.Int64
}

func (s *countingStore) Get(id string) (lifecycle.Record, error) {
	s.gets.Add(1)
	return s.Store.Get(id)
}

func (s *countingStore) List(keep func(*lifecycle.Record) bool) ([]lifecycle.Record, error) {
	s.lists.Add(1)
	return s.Store.List(keep)
}

// TestReconcileReadsOnlyWhatDiffers: a full reconcile decides on the state
// mirror which sandboxes need a closer look, and reads the records of those
// alone: the drifted one, and the store's word on a container the mirror
// does not know (the orphan). A farm of stopped sandboxes costs it no
// decode, yet every correction and orphan is found as before, and a record
// the mirror has not caught up with (a claim being written) is no orphan.
func TestReconcileReadsOnlyWhatDiffers(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	for i := range 200 {
		e.seed(t, fmt.Sprintf("cold%03d", i), lifecycle.Stopped)
	}
	e.seed(t, "hot", lifecycle.Running)
	e.seed(t, "drifted", lifecycle.Running)
	e.rt.Put("drifted", lifecycle.ContainerExited) // it exited behind sandwake's back
	e.rt.Put("orphan", lifecycle.ContainerRunning) // no record
	// A record the store holds and the new manager's mirror will not:
	// written after that manager read the store.
	cs := &countingStore{Store: e.st}
	m, err := lifecycle.NewManager(cs, e.rt, lifecycle.Config{Now: func() time.Time { return testClock }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e.seed(t, "claimed", lifecycle.Running)
	cs.gets.Store(0)
	cs.lists.Store(0)

	stats, err := m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if stats.Records != 202 || stats.Containers != 204 {
		t.Fatalf("stats = %+v, want 202 records (the mirror's) and 204 containers", stats)
	}
	if !maps.Equal(stats.Corrections, map[string]int{lifecycle.CorrectionExited: 1}) {
		t.Fatalf("corrections = %v, want the drifted sandbox's exit", stats.Corrections)
	}
	if got := e.state(t, "drifted"); got != lifecycle.Stopped {
		t.Fatalf("drifted is %s, want stopped", got)
	}
	if !slices.Equal(stats.Orphans, []string{"orphan"}) {
		t.Fatalf("orphans = %v, want [orphan] (claimed has a record)", stats.Orphans)
	}
	// drifted (under its lock), orphan and claimed (not in the mirror).
	if lists, gets := cs.lists.Load(), cs.gets.Load(); lists != 0 || gets != 3 {
		t.Fatalf("reconcile listed the store %d times and read %d records; want 0 lists and 3 reads", lists, gets)
	}
}

// TestReconcileRepairsTheMirror: a state mirror left wrong (a stop whose
// write reported a failure yet landed) is set right from the store the first
// time reconcile reads the record, so that a later change of the container
// behind sandwake's back is still seen. Without the repair, the mirror's
// "running" matches the restarted container and the sandbox is passed over
// for good, its record stopped.
func TestReconcileRepairsTheMirror(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	e.seed(t, "app1", lifecycle.Stopped)
	e.m.SetState("app1", lifecycle.Running) // the mirror missed the stop
	ctx := context.Background()
	if _, err := e.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if c := e.m.Counts(); c[lifecycle.Running] != 0 || c[lifecycle.Stopped] != 1 {
		t.Fatalf("mirror after a reconcile read the record: %v, want app1 stopped", c)
	}
	// Started outside sandwake: the record must follow.
	e.rt.Put("app1", lifecycle.ContainerRunning)
	stats, err := e.m.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(stats.Corrections, map[string]int{lifecycle.CorrectionRunning: 1}) {
		t.Fatalf("corrections = %v, want app1 adopted as running", stats.Corrections)
	}
	if got := e.state(t, "app1"); got != lifecycle.Running {
		t.Fatalf("app1 is %s, want running", got)
	}
	// A mirror entry with no record behind it goes once read.
	e.m.SetState("ghost", lifecycle.Stopped)
	if _, err := e.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if c := e.m.Counts(); c[lifecycle.Stopped] != 0 {
		t.Fatalf("mirror after a reconcile read ghost's missing record: %v, want no stopped sandbox", c)
	}
}
