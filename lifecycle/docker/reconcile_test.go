package docker_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// Events forwards the real runtime's event stream, so that a manager over a
// counting runtime can follow engine events (Config.WatchEvents): the
// embedded lifecycle.Runtime alone hides it.
func (c *counting) Events(ctx context.Context) (<-chan lifecycle.RuntimeEvent, <-chan error) {
	return c.Runtime.(lifecycle.EventSource).Events(ctx)
}

// stateLog follows a manager's committed events (an OnEvent hook, so it sees
// every transition in commit order): each sandbox's state, when each
// transition committed, and the most sandboxes resident at any moment.
type stateLog struct {
	mu          sync.Mutex
	states      map[string]lifecycle.State
	resident    int
	maxResident int
	events      []lifecycle.Event
}

func watchStates(f *fixture) *stateLog {
	l := &stateLog{states: map[string]lifecycle.State{}}
	f.onEvent(l.observe)
	return l
}

func (l *stateLog) observe(ev lifecycle.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
	if lifecycle.Resident(l.states[ev.SandboxID]) {
		l.resident--
	}
	if ev.To == "" {
		delete(l.states, ev.SandboxID) // destroyed or purged
	} else {
		l.states[ev.SandboxID] = ev.To
	}
	if lifecycle.Resident(ev.To) {
		l.resident++
	}
	l.maxResident = max(l.maxResident, l.resident)
}

// restart forgets the maximum so far and starts counting from the store's
// current records.
func (l *stateLog) restart(t testing.TB, m *lifecycle.Manager) {
	t.Helper()
	recs, err := m.List("")
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.states)
	l.resident = 0
	for _, r := range recs {
		l.states[r.ID] = r.State
		if lifecycle.Resident(r.State) {
			l.resident++
		}
	}
	l.maxResident = l.resident
}

func (l *stateLog) max() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxResident
}

// committed returns the first event that moved id to state to at or after
// since.
func (l *stateLog) committed(id string, to lifecycle.State, since time.Time) (lifecycle.Event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.events {
		if ev.SandboxID == id && ev.To == to && !ev.At.Before(since) {
			return ev, true
		}
	}
	return lifecycle.Event{}, false
}

// dockerResident counts the containers of ids that docker shows running or
// paused.
func dockerResident(ctx context.Context, cli *client.Client, ids map[string]bool) (int, error) {
	f := client.Filters{}
	for k, v := range testenv.Labels() {
		f.Add("label", k+"="+v)
	}
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range res.Items {
		if !ids[c.Labels[docker.LabelID]] {
			continue
		}
		if s := string(c.State); s == "running" || s == "paused" {
			n++
		}
	}
	return n, nil
}

// residentWatch polls the manager's resident count and docker's view every
// few milliseconds until stopped, keeping the maxima.
type residentWatch struct {
	stop    chan struct{}
	done    chan struct{}
	manager int
	docker  int
	polls   int
	errs    []error
}

func watchResident(m *lifecycle.Manager, cli *client.Client, ids map[string]bool) *residentWatch {
	w := &residentWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		stopping := false
		for {
			r, _ := m.Resident()
			w.manager = max(w.manager, r)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			n, err := dockerResident(ctx, cli, ids)
			cancel()
			if err != nil {
				w.errs = append(w.errs, err)
			}
			w.docker = max(w.docker, n)
			w.polls++
			select {
			case <-w.stop:
				if stopping {
					return
				}
				stopping = true // one more look at the final state
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return w
}

// finish stops polling and returns the maxima seen.
func (w *residentWatch) finish(t testing.TB) (manager, docker int) {
	t.Helper()
	close(w.stop)
	<-w.done
	for _, err := range w.errs {
		t.Errorf("listing containers: %v", err)
	}
	t.Logf("resident polled %d times: max %d in the manager, %d in docker", w.polls, w.manager, w.docker)
	return w.manager, w.docker
}

func TestEventsReflectChangesBehindOurBack(t *testing.T) {
	cases := []struct {
		name   string
		spec   lifecycle.Spec
		act    func(t *testing.T, f *fixture, rec lifecycle.Record)
		want   lifecycle.State
		reason string
	}{
		{
			name: "docker kill",
			act: func(t *testing.T, f *fixture, rec lifecycle.Record) {
				if _, err := f.cli.ContainerKill(context.Background(), docker.ContainerName(rec.ID), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
					t.Fatal(err)
				}
			},
			want:   lifecycle.Stopped,
			reason: "exited(137)", // 128 + SIGKILL
		},
		{
			name: "docker rm -f",
			act: func(t *testing.T, f *fixture, rec lifecycle.Record) {
				if _, err := f.cli.ContainerRemove(context.Background(), docker.ContainerName(rec.ID), client.ContainerRemoveOptions{Force: true}); err != nil {
					t.Fatal(err)
				}
			},
			want:   lifecycle.Killed,
			reason: "container_missing",
		},
		{
			name: "docker pause",
			act: func(t *testing.T, f *fixture, rec lifecycle.Record) {
				if _, err := f.cli.ContainerPause(context.Background(), docker.ContainerName(rec.ID), client.ContainerPauseOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			want:   lifecycle.Paused,
			reason: "paused_outside",
		},
		{
			name: "out of memory",
			spec: lifecycle.Spec{MemoryMB: 16},
			act: func(t *testing.T, f *fixture, rec lifecycle.Record) {
				// The app may die before its answer is complete: only the
				// container's fate is checked.
				resp, err := http.Get("http://" + upstream(t, rec) + "/oom")
				if err == nil {
					resp.Body.Close()
				}
			},
			want:   lifecycle.Stopped,
			reason: "oom",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, lifecycle.Config{WatchEvents: true})
			log := watchStates(f)
			rec := f.create(tc.spec)
			ctx := context.Background()

			start := time.Now()
			tc.act(t, f, rec)
			acted := time.Since(start)
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				got, err := f.store.Get(rec.ID)
				if err != nil {
					return false, err.Error()
				}
				return got.State == tc.want && got.Reason == tc.reason,
					fmt.Sprintf("sandbox is %s (%s), want %s (%s)", got.State, got.Reason, tc.want, tc.reason)
			})
			if ev, ok := log.committed(rec.ID, tc.want, start); ok {
				t.Logf("%s: store shows %s (%s) %s after the docker call began, %s after it returned",
					tc.name, tc.want, tc.reason, ev.At.Sub(start).Round(time.Millisecond), ev.At.Sub(start.Add(acted)).Round(time.Millisecond))
			}
			h, err := f.store.History(rec.ID)
			if err != nil {
				t.Fatal(err)
			}
			var path []string
			for _, e := range h {
				path = append(path, fmt.Sprintf("%s(%s)", e.To, e.Reason))
			}
			t.Logf("history: %v", path)

			woke, err := f.m.Wake(ctx, rec.ID)
			if err != nil {
				t.Fatalf("wake after %s: %v", tc.name, err)
			}
			if woke.State != lifecycle.Running {
				t.Fatalf("wake returned %s", woke.State)
			}
			if code, body := get(t, upstream(t, woke), "/healthz"); code != http.StatusOK {
				t.Fatalf("healthz after wake: %d %q", code, body)
			}
			mustState(t, f.store, rec.ID, lifecycle.Running)
		})
	}
}

func TestBootReconcile(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, lifecycle.Config{})
	removed := f.create(lifecycle.Spec{MemoryMB: 32})
	stopped := f.create(lifecycle.Spec{MemoryMB: 32})
	paused := f.create(lifecycle.Spec{MemoryMB: 32})
	// Same labels, another store: to this store it is an orphan.
	other := newFixture(t, lifecycle.Config{})
	orphan := other.create(lifecycle.Spec{MemoryMB: 32})
	if err := f.m.Close(); err != nil {
		t.Fatal(err)
	}

	// Behind sandwake's back, while it is down.
	if _, err := f.cli.ContainerRemove(ctx, docker.ContainerName(removed.ID), client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.ContainerStop(ctx, docker.ContainerName(stopped.ID), client.ContainerStopOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.ContainerPause(ctx, docker.ContainerName(paused.ID), client.ContainerPauseOptions{}); err != nil {
		t.Fatal(err)
	}
	ci, err := f.cli.ContainerInspect(ctx, docker.ContainerName(stopped.ID), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exitReason := fmt.Sprintf("exited(%d)", ci.Container.State.ExitCode)
	t.Logf("docker stop left exit code %d", ci.Container.State.ExitCode)

	var (
		mu          sync.Mutex
		corrections []lifecycle.Correction
	)
	m, err := lifecycle.NewManager(f.store, f.rt, lifecycle.Config{OnReconcile: func(c lifecycle.Correction) {
		mu.Lock()
		defer mu.Unlock()
		corrections = append(corrections, c)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	stats, err := m.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reconcile: %+v", stats)

	for _, want := range []struct {
		id     string
		state  lifecycle.State
		reason string
	}{
		{removed.ID, lifecycle.Killed, "container_missing"},
		{stopped.ID, lifecycle.Stopped, exitReason},
		{paused.ID, lifecycle.Paused, "paused_outside"},
	} {
		rec := mustState(t, f.store, want.id, want.state)
		if rec.Reason != want.reason {
			t.Errorf("sandbox %s: reason %q, want %q", want.id, rec.Reason, want.reason)
		}
		if rec.VerifiedAt.IsZero() {
			t.Errorf("sandbox %s: verified_at not set by the correction", want.id)
		}
	}
	if s := mustState(t, f.store, removed.ID, lifecycle.Killed); s.ContainerID != "" || len(s.Upstreams) != 0 {
		t.Errorf("killed sandbox keeps container %q upstreams %v", s.ContainerID, s.Upstreams)
	}
	if s := mustState(t, f.store, stopped.ID, lifecycle.Stopped); s.StoppedAt.IsZero() {
		t.Error("stopped_at not set by the correction")
	}
	wantCorr := map[string]int{lifecycle.CorrectionMissing: 1, lifecycle.CorrectionExited: 1, lifecycle.CorrectionPaused: 1}
	if fmt.Sprint(stats.Corrections) != fmt.Sprint(wantCorr) {
		t.Errorf("corrections %v, want %v", stats.Corrections, wantCorr)
	}
	mu.Lock()
	if len(corrections) != 3 {
		t.Errorf("OnReconcile saw %d corrections, want 3: %+v", len(corrections), corrections)
	}
	mu.Unlock()
	if stats.Records != 3 {
		t.Errorf("records %d, want 3", stats.Records)
	}
	if !slices.Contains(stats.Orphans, orphan.ID) {
		t.Errorf("orphans %v do not name %s", stats.Orphans, orphan.ID)
	}
	for _, id := range []string{removed.ID, stopped.ID, paused.ID} {
		if slices.Contains(stats.Orphans, id) {
			t.Errorf("sandbox %s with a record counted as orphan", id)
		}
	}
	if _, err := f.cli.ContainerInspect(ctx, docker.ContainerName(orphan.ID), client.ContainerInspectOptions{}); err != nil {
		t.Fatalf("orphan removed without orphans remove: %v", err)
	}
	if counts := m.Counts(); counts[lifecycle.Paused] != 1 || counts[lifecycle.Running] != 0 {
		t.Errorf("manager counts %v after reconcile", counts)
	}
	if r, _ := m.Resident(); r != 1 {
		t.Errorf("resident %d after reconcile, want 1 (the paused one)", r)
	}

	// The store now follows docker: a second pass changes nothing.
	again, err := m.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Corrections) != 0 {
		t.Errorf("second reconcile corrected %v", again.Corrections)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	// Only orphans remove removes the orphan, and nothing else.
	rm, err := lifecycle.NewManager(f.store, f.rt, lifecycle.Config{OrphansRemove: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rm.Close()
	stats, err = rm.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(stats.Orphans, orphan.ID) || stats.Corrections[lifecycle.CorrectionOrphanRemoved] != len(stats.Orphans) {
		t.Errorf("with orphans remove: orphans %v, corrections %v", stats.Orphans, stats.Corrections)
	}
	if _, err := f.cli.ContainerInspect(ctx, docker.ContainerName(orphan.ID), client.ContainerInspectOptions{}); err == nil {
		t.Error("orphan container still there with orphans remove")
	}
	for _, id := range []string{stopped.ID, paused.ID} {
		if _, err := f.cli.ContainerInspect(ctx, docker.ContainerName(id), client.ContainerInspectOptions{}); err != nil {
			t.Errorf("container of sandbox %s with a record: %v", id, err)
		}
	}
	if _, err := f.cli.VolumeInspect(ctx, docker.VolumeName(orphan.ID), client.VolumeInspectOptions{}); err != nil {
		t.Errorf("orphan's volume removed with its container: %v", err)
	}
}

func TestPressureMaxResident(t *testing.T) {
	settings := func(maxResident int) lifecycle.Settings {
		return lifecycle.Settings{MaxResident: maxResident, WakeTimeout: 60 * time.Second, KeepaliveMax: 24 * time.Hour}
	}
	// createStopped makes n sandboxes and stops them, returning their ids.
	createStopped := func(t *testing.T, f *fixture, n int) ([]string, map[string]bool) {
		t.Helper()
		ids := make([]string, n)
		set := make(map[string]bool, n)
		for i := range ids {
			ids[i] = f.create(lifecycle.Spec{MemoryMB: 32}).ID
			set[ids[i]] = true
			if _, err := f.m.Stop(context.Background(), ids[i], "test"); err != nil {
				t.Fatal(err)
			}
		}
		return ids, set
	}

	t.Run("least recently active idle ones are stopped", func(t *testing.T) {
		const n, limit = 5, 3
		f := newFixture(t, lifecycle.Config{MaxResident: n})
		log := watchStates(f)
		ids, set := createStopped(t, f, n)
		f.m.Reconfigure(settings(limit))
		log.restart(t, f.m)
		ctx := context.Background()

		// Sandbox 0 is woken first, so it is the least recently active:
		// only its open connection keeps it from being evicted.
		busy := f.m.Activity(ids[0])
		busy.Open()
		defer busy.Close()
		w := watchResident(f.m, f.cli, set)
		for i, id := range ids {
			rec, err := f.m.Wake(ctx, id)
			if err != nil {
				t.Fatalf("wake %d: %v", i, err)
			}
			if rec.State != lifecycle.Running {
				t.Fatalf("wake %d returned %s", i, rec.State)
			}
			f.m.Activity(id).Touch()
			if r, _ := f.m.Resident(); r > limit {
				t.Errorf("after wake %d: %d resident", i, r)
			}
		}
		manager, dockerMax := w.finish(t)
		if manager > limit || dockerMax > limit || log.max() > limit {
			t.Errorf("resident went over %d: manager %d, docker %d, events %d", limit, manager, dockerMax, log.max())
		}

		// 0 (open connection), 3 and 4 stay; 1 then 2 were the least
		// recently active idle ones when 3 and 4 needed room.
		for i, want := range []lifecycle.State{lifecycle.Running, lifecycle.Stopped, lifecycle.Stopped, lifecycle.Running, lifecycle.Running} {
			rec := mustState(t, f.store, ids[i], want)
			if want == lifecycle.Stopped && rec.Reason != "evicted" {
				t.Errorf("sandbox %d stopped with reason %q, want evicted", i, rec.Reason)
			}
		}
		if code, _ := get(t, upstream(t, mustState(t, f.store, ids[0], lifecycle.Running)), "/healthz"); code != http.StatusOK {
			t.Fatalf("sandbox with an open connection answers %d", code)
		}
		if r, reserved := f.m.Resident(); r != limit || reserved != 0 {
			t.Errorf("resident %d reserved %d at the end, want %d and 0", r, reserved, limit)
		}
		if n, err := dockerResident(ctx, f.cli, set); err != nil || n != limit {
			t.Errorf("docker shows %d resident (%v), want %d", n, err, limit)
		}

		// The pressure reaper, with the cap lowered to 1: the idle ones go,
		// least recently active first; the open connection keeps 0 although
		// it is the least recently active of all.
		f.m.Reconfigure(settings(1))
		stats, err := f.m.ReapOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := stats.Actions["pressure"][lifecycle.ActionStop]; got != 2 || stats.Total() != 2 {
			t.Errorf("reaper actions %v, want 2 pressure stops", stats.Actions)
		}
		for i, want := range []lifecycle.State{lifecycle.Running, lifecycle.Stopped, lifecycle.Stopped, lifecycle.Stopped, lifecycle.Stopped} {
			rec := mustState(t, f.store, ids[i], want)
			if i >= 3 && rec.Reason != "pressure_resident" {
				t.Errorf("sandbox %d stopped with reason %q, want pressure_resident", i, rec.Reason)
			}
		}
		s3, ok3 := log.committed(ids[3], lifecycle.Stopped, time.Time{})
		s4, ok4 := log.committed(ids[4], lifecycle.Stopped, time.Time{})
		if !ok3 || !ok4 || s3.ID > s4.ID {
			t.Errorf("pressure stopped 4 (event %d) before 3 (event %d), want least recently active first", s4.ID, s3.ID)
		}
		if n, err := dockerResident(ctx, f.cli, set); err != nil || n != 1 {
			t.Errorf("docker shows %d resident (%v) after the pressure pass, want 1", n, err)
		}
	})

	t.Run("concurrent wakes of different sandboxes never overshoot", func(t *testing.T) {
		const n, limit = 8, 3
		f := newFixture(t, lifecycle.Config{MaxResident: n})
		log := watchStates(f)
		ids, set := createStopped(t, f, n)
		f.m.Reconfigure(settings(limit))
		ctx := context.Background()
		// Three idle residents to evict, so that evictions race with the
		// wakes; they are woken again themselves, too.
		for _, id := range ids[:limit] {
			if _, err := f.m.Wake(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		log.restart(t, f.m)

		w := watchResident(f.m, f.cli, set)
		var (
			wg       sync.WaitGroup
			results  = make([]error, n)
			gate     = make(chan struct{})
			statesMu sync.Mutex
			running  int
		)
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				rec, err := f.m.Wake(ctx, id)
				results[i] = err
				if err == nil && rec.State == lifecycle.Running {
					statesMu.Lock()
					running++
					statesMu.Unlock()
				}
			}()
		}
		close(gate)
		wg.Wait()
		manager, dockerMax := w.finish(t)

		capacity := 0
		for i, err := range results {
			switch {
			case err == nil:
			case errors.Is(err, lifecycle.ErrCapacity):
				capacity++
			default:
				t.Errorf("wake %d: %v, want running or ErrCapacity", i, err)
			}
		}
		t.Logf("%d wakes returned running, %d ErrCapacity", running, capacity)
		if running+capacity != n {
			t.Errorf("%d running + %d ErrCapacity of %d wakes", running, capacity, n)
		}
		if running == 0 {
			t.Error("no wake succeeded")
		}
		if manager > limit || dockerMax > limit || log.max() > limit {
			t.Errorf("resident went over %d: manager %d, docker %d, events %d", limit, manager, dockerMax, log.max())
		}
		if r, reserved := f.m.Resident(); r > limit || reserved != 0 {
			t.Errorf("resident %d reserved %d at the end", r, reserved)
		}
		if c, err := dockerResident(ctx, f.cli, set); err != nil || c > limit {
			t.Errorf("docker shows %d resident (%v) at the end", c, err)
		}
		for _, id := range ids {
			rec, err := f.store.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != lifecycle.Running && rec.State != lifecycle.Stopped {
				t.Errorf("sandbox %s ended %s (%s)", id, rec.State, rec.Error)
			}
		}
	})
}
