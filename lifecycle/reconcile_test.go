package lifecycle

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
)

// corrections collects what Config.OnReconcile receives.
type corrections struct {
	mu   sync.Mutex
	list []Correction
}

func (c *corrections) note(x Correction) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.list = append(c.list, x)
}

func (c *corrections) all() []Correction {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.list)
}

// reconcileEnv is a test env with a movable clock whose corrections are
// collected.
func reconcileEnv(t *testing.T, cfg Config) (*testEnv, *fakeClock, *corrections) {
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
		state     State
		container ContainerState // "" : no container
		edit      func(*Container)
		at        time.Duration // clock when reconciling
		want      State
		kind      string // "" : no correction
		reason    string
		// moved: the container's port moved (a start outside sandwake) to
		// an address that answers, and the record must adopt it; silent:
		// to one where nothing answers yet.
		moved, silent bool
	}{
		{name: "running, container missing", state: Running, want: Killed, kind: CorrectionMissing, reason: "container_missing"},
		{name: "paused, container missing", state: Paused, want: Killed, kind: CorrectionMissing, reason: "container_missing"},
		{name: "stopped, container missing", state: Stopped, want: Killed, kind: CorrectionMissing, reason: "container_missing"},
		{name: "running, exited(3)", state: Running, container: ContainerExited, edit: func(c *Container) { c.ExitCode = 3 },
			want: Stopped, kind: CorrectionExited, reason: "exited(3)"},
		{name: "running, OOM-killed", state: Running, container: ContainerExited, edit: func(c *Container) { c.ExitCode, c.OOMKilled = 137, true },
			want: Stopped, kind: CorrectionOOM, reason: "oom"},
		{name: "running, dead", state: Running, container: ContainerDead, edit: func(c *Container) { c.ExitCode = 1 },
			want: Stopped, kind: CorrectionExited, reason: "exited(1)"},
		// A container paused before a daemon or host restart comes back exited.
		{name: "paused, exited", state: Paused, container: ContainerExited,
			want: Stopped, kind: CorrectionExited, reason: "exited(0)"},
		{name: "running, paused outside", state: Running, container: ContainerPaused,
			want: Paused, kind: CorrectionPaused, reason: "paused_outside"},
		{name: "stopped, started and paused outside", state: Stopped, container: ContainerPaused,
			want: Paused, kind: CorrectionPaused, reason: "paused_outside"},
		{name: "paused, unpaused outside", state: Paused, container: ContainerRunning,
			want: Running, kind: CorrectionRunning, reason: "started_outside", moved: true},
		{name: "stopped, started outside", state: Stopped, container: ContainerRunning,
			want: Running, kind: CorrectionRunning, reason: "started_outside", moved: true},
		{name: "killed, started outside", state: Killed, container: ContainerRunning,
			want: Running, kind: CorrectionRunning, reason: "started_outside", moved: true},
		{name: "error, started outside", state: Error, container: ContainerRunning,
			want: Running, kind: CorrectionRunning, reason: "started_outside", moved: true},
		// A running container is adopted only once its port answers (a
		// wake cut short by a crash may have started it before the app
		// listens); the next wake waits for readiness instead.
		{name: "stopped, started outside, not listening yet", state: Stopped, container: ContainerRunning, silent: true, want: Stopped},
		{name: "killed, started outside, not listening yet", state: Killed, container: ContainerRunning, silent: true, want: Killed},
		// Create holds the lock for its whole run: a creating record seen
		// under its lock is a create that died with an earlier process,
		// however young (see TestReconcileSkipsHeld for one in flight).
		{name: "creating, a second old", state: Creating, container: ContainerCreated,
			want: Error, kind: CorrectionStuckCreating, reason: "stuck_creating"},
		{name: "creating without a container, an hour old", state: Creating, at: time.Hour,
			want: Error, kind: CorrectionStuckCreating, reason: "stuck_creating"},
		{name: "running, running", state: Running, container: ContainerRunning, want: Running},
		{name: "paused, paused", state: Paused, container: ContainerPaused, want: Paused},
		{name: "stopped, exited", state: Stopped, container: ContainerExited, want: Stopped},
		{name: "stopped, created", state: Stopped, container: ContainerCreated, want: Stopped},
		{name: "error, exited", state: Error, container: ContainerExited, want: Error},
		{name: "killed, no container", state: Killed, want: Killed},
		{name: "expired, no container", state: Expired, want: Expired},
		{name: "error, no container", state: Error, want: Error},
		{name: "running, restarting", state: Running, container: ContainerRestarting, want: Running},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, clock, got := reconcileEnv(t, Config{})
			e.seed(t, "app1", tt.state)
			var moved map[int]string
			switch {
			case tt.moved:
				moved = map[int]string{testPort: answeringAddr(t)}
			case tt.silent:
				moved = map[int]string{testPort: closedAddr(t)}
			}
			if moved != nil {
				e.rt.setUpstreams(moved)
			}
			e.rt.put("app1", tt.container)
			if tt.edit != nil {
				e.rt.edit("app1", tt.edit)
			}
			e.rt.resetCalls()
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
			if e.rt.count("List") != 1 || e.rt.count("Start")+e.rt.count("Stop")+e.rt.count("Remove")+e.rt.count("Create") != 0 {
				t.Fatalf("runtime calls = %v: reconcile only looks", e.rt.snapshot())
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
			want := Correction{ID: "app1", Kind: tt.kind, From: tt.state, To: tt.want, Reason: tt.reason}
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
			case Killed:
				if rec.ContainerID != "" || rec.Upstreams != nil {
					t.Fatalf("killed record keeps container %q, upstreams %v", rec.ContainerID, rec.Upstreams)
				}
			case Stopped:
				if !rec.StoppedAt.Equal(clock.Now()) {
					t.Fatalf("stopped at %v", rec.StoppedAt)
				}
			case Error:
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
			if res, _ := e.m.Resident(); res != btoi(Resident(tt.want)) {
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
		e, clock, got := reconcileEnv(t, Config{})
		e.seed(t, "app1", Running)
		movedUpstreams := map[int]string{testPort: answeringAddr(t)}
		e.rt.edit("app1", func(c *Container) { c.Upstreams = maps.Clone(movedUpstreams) })
		clock.at(time.Minute)
		c, err := e.m.ReconcileOne(context.Background(), "app1")
		if err != nil {
			t.Fatal(err)
		}
		want := Correction{ID: "app1", Kind: CorrectionUpstream, From: Running, To: Running, Reason: "upstream_changed"}
		if c == nil || *c != want {
			t.Fatalf("correction = %+v, want %+v", c, want)
		}
		if g := got.all(); len(g) != 1 || g[0] != want {
			t.Fatalf("OnReconcile got %+v", g)
		}
		rec, _ := e.m.Get("app1")
		if !maps.Equal(rec.Upstreams, movedUpstreams) || rec.State != Running || !rec.StateSince.Equal(testClock) {
			t.Fatalf("record = %+v", rec)
		}
		evs := e.history(t, "app1")
		if len(evs) != 2 || evs[1].From != Running || evs[1].To != Running || evs[1].Reason != "upstream_changed" {
			t.Fatalf("events = %+v", evs)
		}
		wantCalls(t, e.rt, map[string]int{"Inspect": 1})
		if res, _ := e.m.Resident(); res != 1 {
			t.Fatalf("resident = %d, want 1", res)
		}
	})

	t.Run("nothing changed", func(t *testing.T) {
		e, _, got := reconcileEnv(t, Config{})
		e.seed(t, "app1", Running)
		c, err := e.m.ReconcileOne(context.Background(), "app1")
		if err != nil || c != nil || len(got.all()) != 0 || len(e.history(t, "app1")) != 1 {
			t.Fatalf("correction %+v, %v", c, err)
		}
	})

	t.Run("died", func(t *testing.T) {
		e, _, _ := reconcileEnv(t, Config{})
		e.seed(t, "app1", Running)
		e.rt.put("app1", ContainerExited)
		e.rt.edit("app1", func(c *Container) { c.ExitCode = 2 })
		c, err := e.m.ReconcileOne(context.Background(), "app1")
		if err != nil || c == nil || c.Kind != CorrectionExited || c.Reason != "exited(2)" {
			t.Fatalf("correction %+v, %v", c, err)
		}
	})

	t.Run("no record", func(t *testing.T) {
		e, _, _ := reconcileEnv(t, Config{})
		e.rt.put("ghost", ContainerRunning)
		if c, err := e.m.ReconcileOne(context.Background(), "ghost"); err != nil || c != nil {
			t.Fatalf("correction %+v, %v", c, err)
		}
	})

	t.Run("engine unavailable", func(t *testing.T) {
		e, _, _ := reconcileEnv(t, Config{})
		e.seed(t, "app1", Running)
		e.rt.failWith("Inspect", fmt.Errorf("docker: %w", ErrUnavailable))
		if _, err := e.m.ReconcileOne(context.Background(), "app1"); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if got := e.state(t, "app1"); got != Running {
			t.Fatalf("state = %s, want running", got)
		}
	})
}

func TestReconcileOrphans(t *testing.T) {
	for _, remove := range []bool{false, true} {
		t.Run(fmt.Sprintf("remove=%v", remove), func(t *testing.T) {
			e, _, got := reconcileEnv(t, Config{OrphansRemove: remove})
			e.seed(t, "app1", Running)
			e.rt.put("ghost2", ContainerExited)
			e.rt.put("ghost1", ContainerRunning)
			// A container without the sandbox label is not sandwake's.
			e.rt.put("foreign", ContainerRunning)
			e.rt.edit("foreign", func(c *Container) { c.SandboxID = "" })
			e.rt.resetCalls()
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
					if e.rt.containerState(id) == "" {
						t.Fatalf("%s removed without orphans remove", id)
					}
				}
				return
			}
			wantCalls(t, e.rt, map[string]int{"List": 1, "Remove": 2})
			if !maps.Equal(stats.Corrections, map[string]int{CorrectionOrphanRemoved: 2}) {
				t.Fatalf("corrections = %v", stats.Corrections)
			}
			want := []Correction{{ID: "ghost1", Kind: CorrectionOrphanRemoved}, {ID: "ghost2", Kind: CorrectionOrphanRemoved}}
			if g := got.all(); !slices.Equal(g, want) {
				t.Fatalf("OnReconcile got %+v, want %+v", g, want)
			}
			for id, want := range map[string]ContainerState{"ghost1": "", "ghost2": "", "foreign": ContainerRunning, "app1": ContainerRunning} {
				if got := e.rt.containerState(id); got != want {
					t.Fatalf("container of %s is %q, want %q", id, got, want)
				}
			}
			if got := e.state(t, "app1"); got != Running {
				t.Fatalf("app1 is %s", got)
			}
		})
	}
}

func TestReconcileFailure(t *testing.T) {
	t.Run("list unavailable", func(t *testing.T) {
		e, _, got := reconcileEnv(t, Config{})
		e.seed(t, "app1", Running)
		e.rt.put("app1", "") // would be killed
		e.rt.failWith("List", fmt.Errorf("docker: %w", ErrUnavailable))
		if _, err := e.m.Reconcile(context.Background()); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if s := e.state(t, "app1"); s != Running || len(got.all()) != 0 {
			t.Fatalf("state %s, corrections %v after a failed reconcile", s, got.all())
		}
		if !e.m.LastReconcile().IsZero() {
			t.Fatal("LastReconcile set by a failed reconcile")
		}
		wantCalls(t, e.rt, map[string]int{"List": 1})
	})

	t.Run("inspect unavailable", func(t *testing.T) {
		e, _, _ := reconcileEnv(t, Config{})
		e.seed(t, "app1", Running)
		e.rt.put("app1", ContainerExited)
		e.rt.failWith("Inspect", fmt.Errorf("docker: %w", ErrUnavailable))
		if _, err := e.m.Reconcile(context.Background()); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if s := e.state(t, "app1"); s != Running {
			t.Fatalf("state %s", s)
		}
		if !e.m.LastReconcile().IsZero() {
			t.Fatal("LastReconcile set by a failed reconcile")
		}
	})

	t.Run("last success kept", func(t *testing.T) {
		e, clock, _ := reconcileEnv(t, Config{})
		clock.at(time.Minute)
		if _, err := e.m.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
		clock.at(2 * time.Minute)
		e.rt.failWith("List", fmt.Errorf("docker: %w", ErrUnavailable))
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
		e, _, got := reconcileEnv(t, Config{})
		g := e.rt.hold(t, "Start", "app1")
		done := make(chan error, 1)
		go func() {
			_, err := e.m.Create(context.Background(), CreateRequest{ID: "app1", Spec: testSpec()})
			done <- err
		}()
		receive(t, g.entered, "the start of the create")
		stats, err := e.m.Reconcile(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if s := e.state(t, "app1"); s != Creating || len(stats.Corrections) != 0 || len(stats.Orphans) != 0 || len(got.all()) != 0 {
			t.Fatalf("reconcile during a create: %s, %+v", s, stats)
		}
		g.release()
		if err := receive(t, done, "the create"); err != nil {
			t.Fatal(err)
		}
		if s := e.state(t, "app1"); s != Running {
			t.Fatalf("created sandbox is %s", s)
		}
	})

	e, _, got := reconcileEnv(t, Config{})
	e.seed(t, "held", Running)
	e.seed(t, "free", Running)
	e.rt.put("held", "")
	e.rt.put("free", "")
	unlock := e.m.locks.lock("held")
	stats, err := e.m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if e.state(t, "held") != Running || e.state(t, "free") != Killed || stats.Corrections[CorrectionMissing] != 1 {
		t.Fatalf("held %s, free %s, corrections %v", e.state(t, "held"), e.state(t, "free"), stats.Corrections)
	}
	if len(stats.Orphans) != 0 {
		t.Fatalf("orphans = %v", stats.Orphans)
	}
	unlock()
	if _, err := e.m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := e.state(t, "held"); s != Killed || len(got.all()) != 2 {
		t.Fatalf("held is %s after release, corrections %v", s, got.all())
	}
}

// eventRuntime is the fake engine with an event stream. Each subscription is
// handed to the test through streams.
type eventRuntime struct {
	*fakeRuntime
	streams    chan *fakeStream
	subscribed atomic.Int32
}

type fakeStream struct {
	ctx  context.Context
	evs  chan RuntimeEvent
	errs chan error
}

func (r *eventRuntime) Events(ctx context.Context) (<-chan RuntimeEvent, <-chan error) {
	r.subscribed.Add(1)
	s := &fakeStream{ctx: ctx, evs: make(chan RuntimeEvent), errs: make(chan error, 1)}
	r.streams <- s
	return s.evs, s.errs
}

var _ EventSource = (*eventRuntime)(nil)

// send delivers ev on the stream; the manager must be reading it.
func (s *fakeStream) send(t *testing.T, ev RuntimeEvent) {
	t.Helper()
	select {
	case s.evs <- ev:
	case <-s.ctx.Done():
		t.Fatalf("stream ended before %+v was delivered", ev)
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out delivering %+v", ev)
	}
}

func eventsEnv(t *testing.T, cfg Config) (*testEnv, *eventRuntime) {
	t.Helper()
	var er *eventRuntime
	e := newTestEnvWith(t, cfg, func(f *fakeRuntime) Runtime {
		er = &eventRuntime{fakeRuntime: f, streams: make(chan *fakeStream, 64)}
		return er
	})
	return e, er
}

func TestRuntimeEvents(t *testing.T) {
	tests := []struct {
		name      string
		state     State
		container ContainerState
		edit      func(*Container)
		action    string
		want      State
		reason    string
	}{
		{"die", Running, ContainerExited, func(c *Container) { c.ExitCode = 3 }, "die", Stopped, "exited(3)"},
		{"oom", Running, ContainerExited, func(c *Container) { c.ExitCode, c.OOMKilled = 137, true }, "oom", Stopped, "oom"},
		{"destroy", Stopped, "", nil, "destroy", Killed, "container_missing"},
		{"pause", Running, ContainerPaused, nil, "pause", Paused, "paused_outside"},
		{"unpause", Paused, ContainerRunning, nil, "unpause", Running, "started_outside"},
		{"start", Stopped, ContainerRunning, nil, "start", Running, "started_outside"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, er := eventsEnv(t, Config{WatchEvents: true})
			s := receive(t, er.streams, "the subscription")
			e.seed(t, "app1", tt.state)
			e.rt.put("app1", tt.container)
			if tt.edit != nil {
				e.rt.edit("app1", tt.edit)
			}
			s.send(t, RuntimeEvent{SandboxID: "app1", Action: tt.action})
			waitFor(t, "the event to be reconciled", func() bool { return e.state(t, "app1") == tt.want })
			if r := e.lastReason(t, "app1"); r != tt.reason {
				t.Fatalf("reason = %q, want %q", r, tt.reason)
			}
			if n := er.subscribed.Load(); n != 1 {
				t.Fatalf("%d subscriptions, want 1", n)
			}
		})
	}

	t.Run("ignored events", func(t *testing.T) {
		e, er := eventsEnv(t, Config{WatchEvents: true})
		s := receive(t, er.streams, "the subscription")
		e.seed(t, "app1", Running)
		e.rt.put("app1", "")
		for _, id := range []string{"", "not-an-id", "nosuch"} {
			s.send(t, RuntimeEvent{SandboxID: id, Action: "die"})
		}
		s.send(t, RuntimeEvent{SandboxID: "app1", Action: "destroy"})
		waitFor(t, "app1 to be killed", func() bool { return e.state(t, "app1") == Killed })
		e.m.Close() // waits for every reconcile an event started
		// Invalid ids never reach the engine, nor does an id without a record.
		if n := e.rt.count("Inspect"); n != 1 {
			t.Fatalf("%d inspects, want 1 (app1)", n)
		}
	})

	for _, brk := range []struct {
		name   string
		break_ func(s *fakeStream)
	}{
		{"error", func(s *fakeStream) { s.errs <- fmt.Errorf("reading events: %w", ErrUnavailable) }},
		{"errs closed", func(s *fakeStream) { close(s.errs) }},
		{"events closed", func(s *fakeStream) { close(s.evs) }},
	} {
		t.Run("stream breaks: "+brk.name, func(t *testing.T) {
			e, er := eventsEnv(t, Config{WatchEvents: true})
			s := receive(t, er.streams, "the subscription")
			// A change that no event reports, as if missed while the
			// stream was down.
			e.seed(t, "app1", Running)
			e.rt.put("app1", "")
			brk.break_(s)
			s2 := receive(t, er.streams, "the second subscription")
			if n := er.subscribed.Load(); n != 2 {
				t.Fatalf("%d subscriptions, want 2", n)
			}
			if s.ctx.Err() == nil {
				t.Fatal("the broken subscription's context is still live")
			}
			// The full reconcile runs before the new subscription.
			if got := e.state(t, "app1"); got != Killed {
				t.Fatalf("app1 is %s after resubscribing, want killed by the full reconcile", got)
			}
			if e.m.LastReconcile().IsZero() {
				t.Fatal("no full reconcile after the stream broke")
			}
			// The new stream works.
			e.seed(t, "app2", Running)
			e.rt.put("app2", ContainerPaused)
			s2.send(t, RuntimeEvent{SandboxID: "app2", Action: "pause"})
			waitFor(t, "app2 to be paused", func() bool { return e.state(t, "app2") == Paused })
		})
	}

	t.Run("not watched", func(t *testing.T) {
		e, er := eventsEnv(t, Config{})
		e.m.Close()
		if n := er.subscribed.Load(); n != 0 {
			t.Fatalf("%d subscriptions without WatchEvents", n)
		}
	})

	t.Run("close ends the subscription", func(t *testing.T) {
		e, er := eventsEnv(t, Config{WatchEvents: true})
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
	e, er := eventsEnv(t, Config{WatchEvents: true})
	s := receive(t, er.streams, "the subscription")
	const sandboxes, perSandbox = 50, 20
	ids := make([]string, sandboxes)
	for i := range ids {
		ids[i] = fmt.Sprintf("app%d", i)
		e.seed(t, ids[i], Running)
		e.rt.put(ids[i], "")
	}
	e.rt.resetCalls()
	// Every inspect waits at the gate while the flood arrives: the workers
	// are busy, everything else is queued.
	g := e.rt.hold(t, "Inspect", "")
	before := runtime.NumGoroutine()
	for range perSandbox {
		for _, id := range ids {
			s.send(t, RuntimeEvent{SandboxID: id, Action: "die"})
		}
	}
	if grown := runtime.NumGoroutine() - before; grown > 10 {
		t.Fatalf("%d goroutines more during a flood of %d events", grown, sandboxes*perSandbox)
	}
	if n := e.m.events.len(); n > sandboxes {
		t.Fatalf("%d ids queued for %d sandboxes", n, sandboxes)
	}
	g.release()
	for _, id := range ids {
		waitFor(t, id+" to be killed", func() bool { return e.state(t, id) == Killed })
	}
	waitFor(t, "the queue to drain", func() bool { return e.m.events.len() == 0 })
	e.m.Close()
	// Each sandbox: one inspect, plus at most one more for the worker that
	// held it when its later events came (they may report something newer).
	if n := e.rt.count("Inspect"); n < sandboxes || n > 2*sandboxes {
		t.Fatalf("%d inspects for %d events over %d sandboxes; want %d to %d", n, sandboxes*perSandbox, sandboxes, sandboxes, 2*sandboxes)
	}
}

func TestWorkQueue(t *testing.T) {
	q := newWorkQueue()
	q.add("a")
	q.add("b")
	q.add("a") // queued already
	if n := q.len(); n != 2 {
		t.Fatalf("len %d, want 2", n)
	}
	id, _ := q.get()
	if id != "a" {
		t.Fatalf("got %q, want a", id)
	}
	q.add("a") // while processing: queued again after done, not before
	if n := q.len(); n != 1 {
		t.Fatalf("len %d while a is processed, want 1 (b)", n)
	}
	q.done("a")
	if id, _ := q.get(); id != "b" {
		t.Fatalf("got %q, want b", id)
	}
	if id, _ := q.get(); id != "a" {
		t.Fatalf("got %q, want a again", id)
	}
	done := make(chan bool)
	go func() {
		_, ok := q.get()
		done <- ok
	}()
	q.close()
	if <-done {
		t.Fatal("get after close returned an id")
	}
	q.add("c")
	if n := q.len(); n != 0 {
		t.Fatalf("add after close queued %d", n)
	}
}

// TestEventsDuringStartup: engine events arrive the moment the manager
// starts; the hooks they call are part of the manager's configuration, so
// nothing registers them while the loops run (go test -race checks it).
func TestEventsDuringStartup(t *testing.T) {
	var changes, events atomic.Int32
	e, er := eventsEnv(t, Config{
		WatchEvents: true, ReapInterval: time.Millisecond, ActivityFlush: time.Millisecond, ReconcileInterval: time.Millisecond,
		OnChange: func(string) { changes.Add(1) },
		OnEvent:  func(Event) { events.Add(1) },
	})
	s := receive(t, er.streams, "the subscription")
	for i := range 20 {
		id := fmt.Sprintf("app%d", i)
		e.seed(t, id, Running)
		e.rt.put(id, "")
		s.send(t, RuntimeEvent{SandboxID: id, Action: "destroy"})
	}
	for i := range 20 {
		id := fmt.Sprintf("app%d", i)
		waitFor(t, id+" to be killed", func() bool { return e.state(t, id) == Killed })
	}
	if changes.Load() < 40 || events.Load() < 40 {
		t.Fatalf("hooks saw %d changes and %d events, want at least 40 each (20 seeds, 20 kills)", changes.Load(), events.Load())
	}
	if err := e.m.Start(); err != nil {
		t.Fatalf("a second Start: %v", err)
	}
	e.m.Close()
	if err := e.m.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v, want ErrClosed", err)
	}
}
