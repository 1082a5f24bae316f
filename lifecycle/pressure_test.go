package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"

	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
)

// eventLog records every committed event, in commit order.
type eventLog struct {
	mu  sync.Mutex
	evs []lifecycle.Event
}

// watch adds a hook to e's manager; add it before the events of interest
// happen.
func (l *eventLog) watch(e *testEnv) *eventLog {
	e.hooks.onEvent(func(ev lifecycle.Event) {
		l.mu.Lock()
		l.evs = append(l.evs, ev)
		l.mu.Unlock()
	})
	return l
}

// stopped lists the sandboxes moved to stopped with a reason starting with
// prefix, in the order they were stopped.
func (l *eventLog) stopped(prefix string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []string
	for _, ev := range l.evs {
		if ev.To == lifecycle.Stopped && strings.HasPrefix(ev.Reason, prefix) {
			ids = append(ids, ev.SandboxID)
		}
	}
	return ids
}

// TestPressureResident: over max_resident, the reaper stops the least
// valuable sandboxes until the count fits: paused before running, least
// recently active first, never a busy one or one another operation holds.
func TestPressureResident(t *testing.T) {
	type sb struct {
		id     string
		state  lifecycle.State
		active time.Duration // last request at +active (0: only the seed's)
		busy   bool          // an open connection
		keep   bool          // a keepalive in the future
		locked bool          // another operation holds it
	}
	tests := []struct {
		name      string
		max       int
		sandboxes []sb
		want      []string // stopped, in order
	}{
		{
			name: "paused first", max: 3,
			sandboxes: []sb{{"a", lifecycle.Running, 1, false, false, false}, {"b", lifecycle.Running, 2, false, false, false}, {"c", lifecycle.Paused, 9, false, false, false}, {"d", lifecycle.Running, 3, false, false, false}},
			want:      []string{"c"},
		},
		{
			name: "paused least recently active first, then running", max: 1,
			sandboxes: []sb{{"a", lifecycle.Running, 1, false, false, false}, {"b", lifecycle.Paused, 5, false, false, false}, {"c", lifecycle.Paused, 4, false, false, false}, {"d", lifecycle.Running, 3, false, false, false}},
			want:      []string{"c", "b", "a"},
		},
		{
			name: "running least recently active first", max: 2,
			sandboxes: []sb{{"a", lifecycle.Running, 2, false, false, false}, {"b", lifecycle.Running, 1, false, false, false}, {"c", lifecycle.Running, 3, false, false, false}, {"d", lifecycle.Running, 4, false, false, false}},
			want:      []string{"b", "a"},
		},
		{
			name: "never seen active counts as oldest", max: 3,
			sandboxes: []sb{{"a", lifecycle.Running, 1, false, false, false}, {"b", lifecycle.Running, 2, false, false, false}, {"c", lifecycle.Running, 0, false, false, false}, {"d", lifecycle.Running, 3, false, false, false}},
			want:      []string{"c"},
		},
		{
			name: "busy ones are skipped", max: 3,
			sandboxes: []sb{{"a", lifecycle.Paused, 1, true, false, false}, {"b", lifecycle.Running, 2, true, false, false}, {"c", lifecycle.Running, 3, false, false, false}, {"d", lifecycle.Running, 4, false, false, false}},
			want:      []string{"c"},
		},
		{
			name: "kept alive ones are skipped", max: 3,
			sandboxes: []sb{{"a", lifecycle.Paused, 1, false, true, false}, {"b", lifecycle.Running, 2, false, true, false}, {"c", lifecycle.Running, 3, false, false, false}, {"d", lifecycle.Running, 4, false, false, false}},
			want:      []string{"c"},
		},
		{
			name: "held ones are skipped", max: 3,
			sandboxes: []sb{{"a", lifecycle.Paused, 1, false, false, true}, {"b", lifecycle.Running, 2, false, false, false}, {"c", lifecycle.Running, 3, false, false, false}, {"d", lifecycle.Running, 4, false, false, false}},
			want:      []string{"b"},
		},
		{
			name: "all busy: nothing stopped", max: 3,
			sandboxes: []sb{{"a", lifecycle.Paused, 1, true, false, false}, {"b", lifecycle.Running, 2, true, false, false}, {"c", lifecycle.Running, 3, false, true, false}, {"d", lifecycle.Running, 4, true, false, false}},
		},
		{
			name: "at the cap: nothing stopped", max: 4,
			sandboxes: []sb{{"a", lifecycle.Paused, 1, false, false, false}, {"b", lifecycle.Running, 2, false, false, false}, {"c", lifecycle.Running, 3, false, false, false}, {"d", lifecycle.Running, 4, false, false, false}},
		},
		{
			name: "no cap: nothing stopped", max: 0,
			sandboxes: []sb{{"a", lifecycle.Paused, 1, false, false, false}, {"b", lifecycle.Running, 2, false, false, false}, {"c", lifecycle.Running, 3, false, false, false}, {"d", lifecycle.Running, 4, false, false, false}},
		},
		{
			name: "only resident ones count", max: 2,
			sandboxes: []sb{{"a", lifecycle.Stopped, 0, false, false, false}, {"b", lifecycle.Killed, 0, false, false, false}, {"c", lifecycle.Running, 3, false, false, false}, {"d", lifecycle.Running, 4, false, false, false}, {"e", lifecycle.Error, 0, false, false, false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Seeding bypasses admission, as a lowered max_resident would.
			e, clock := newClockEnv(t, lifecycle.Config{MaxResident: tt.max})
			for _, s := range tt.sandboxes {
				e.seedWith(t, s.id, s.state, func(r *lifecycle.Record) {
					if s.keep {
						r.KeepaliveUntil = testClock.Add(time.Hour)
					}
				})
			}
			for _, s := range tt.sandboxes {
				if s.active > 0 {
					clock.at(s.active * time.Minute)
					e.m.Activity(s.id).Touch()
				}
				if s.busy {
					e.m.Activity(s.id).Open()
				}
				if s.locked {
					t.Cleanup(e.m.LockID(s.id))
				}
			}
			clock.at(10 * time.Minute)
			log := new(eventLog).watch(e)
			resBefore, _ := e.m.Resident()
			stats := reap(t, e.m)
			var wantAct map[string]map[string]int
			if len(tt.want) > 0 {
				wantAct = map[string]map[string]int{"pressure": {lifecycle.ActionStop: len(tt.want)}}
			}
			wantActions(t, stats, wantAct)
			if got := log.stopped(""); !slices.Equal(got, tt.want) {
				t.Fatalf("stopped %v, want %v", got, tt.want)
			}
			if n := e.rt.Count("Stop"); n != len(tt.want) {
				t.Fatalf("%d stop calls, want %d", n, len(tt.want))
			}
			for _, id := range tt.want {
				if r := e.lastReason(t, id); r != "pressure_resident" {
					t.Fatalf("%s stopped with reason %q, want pressure_resident", id, r)
				}
			}
			if res, reserved := e.m.Resident(); res != resBefore-len(tt.want) || reserved != 0 {
				t.Fatalf("resident, reserved = %d, %d; want %d, 0", res, reserved, resBefore-len(tt.want))
			}
		})
	}

	t.Run("lowered by a reload", func(t *testing.T) {
		e, clock := newClockEnv(t, lifecycle.Config{MaxResident: 10})
		for i := range 6 {
			id := fmt.Sprintf("s%d", i)
			e.seed(t, id, lifecycle.Running)
			clock.at(time.Duration(6-i) * time.Minute) // s5 is the least recently active
			e.m.Activity(id).Touch()
		}
		wantActions(t, reap(t, e.m), nil)
		e.m.Reconfigure(lifecycle.Settings{MaxResident: 4})
		log := new(eventLog).watch(e)
		wantActions(t, reap(t, e.m), map[string]map[string]int{"pressure": {lifecycle.ActionStop: 2}})
		if got := log.stopped("pressure"); !slices.Equal(got, []string{"s5", "s4"}) {
			t.Fatalf("stopped %v, want [s5 s4]", got)
		}
	})

	t.Run("engine unavailable", func(t *testing.T) {
		e, _ := newClockEnv(t, lifecycle.Config{MaxResident: 1})
		e.seed(t, "a", lifecycle.Running)
		e.seed(t, "b", lifecycle.Running)
		e.rt.FailWith("Stop", fmt.Errorf("docker: %w", lifecycle.ErrUnavailable))
		stats := reap(t, e.m)
		if stats.Total() != 0 {
			t.Fatalf("actions = %v, want none", stats.Actions)
		}
		// One attempt, not one per candidate: the engine is down.
		if n := e.rt.Count("Stop"); n != 1 {
			t.Fatalf("%d stop calls, want 1", n)
		}
		if res, _ := e.m.Resident(); res != 2 {
			t.Fatalf("resident = %d, want 2", res)
		}
	})
}

// memoryEnv is a test env whose host memory rises by perStop with every stop
// the fake engine is asked for, starting from base.
func memoryEnv(t *testing.T, cfg lifecycle.Config, base, perStop uint64) *testEnv {
	t.Helper()
	var rt atomic.Pointer[lifecycletest.Runtime]
	cfg.MemAvailable = func() (uint64, error) {
		stops := 0
		if r := rt.Load(); r != nil { // the pool's first pass may ask before the env is returned
			stops = r.Count("Stop")
		}
		return base + perStop*uint64(stops), nil
	}
	e, _ := newClockEnv(t, cfg)
	rt.Store(e.rt)
	return e
}

func TestPressureMemory(t *testing.T) {
	const minFree = 1000
	tests := []struct {
		name     string
		base     uint64 // available before any stop
		perStop  uint64 // freed by each stop
		resident int
		busy     int // the first busy sandboxes have open connections
		want     int // stops
	}{
		// 900 → 960 → 1020 → 1080 → 1140: the third and fourth stops are the
		// hysteresis (relief goes on up to 1100).
		{"relieved with hysteresis", 900, 60, 6, 0, 4},
		{"one stop relieves", 999, 200, 6, 0, 1},
		{"enough memory", 1000, 60, 6, 0, 0},
		// The hysteresis only holds once relief has begun.
		{"between the bars, not relieving", 1050, 60, 6, 0, 0},
		{"stops every idle one and gives up", 0, 1, 5, 2, 3},
		{"all busy", 500, 60, 4, 4, 0},
		{"nothing resident", 500, 60, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := memoryEnv(t, lifecycle.Config{MinFreeMemory: minFree}, tt.base, tt.perStop)
			for i := range tt.resident {
				id := fmt.Sprintf("s%d", i)
				e.seed(t, id, lifecycle.Running)
				if i < tt.busy {
					e.m.Activity(id).Open()
				}
			}
			e.seed(t, "off", lifecycle.Stopped)
			stats := reap(t, e.m)
			var want map[string]map[string]int
			if tt.want > 0 {
				want = map[string]map[string]int{"pressure": {lifecycle.ActionStop: tt.want}}
			}
			wantActions(t, stats, want)
			if n := e.rt.Count("Stop"); n != tt.want {
				t.Fatalf("%d stop calls, want %d", n, tt.want)
			}
			for i := range tt.busy {
				if got := e.state(t, fmt.Sprintf("s%d", i)); got != lifecycle.Running {
					t.Fatalf("busy s%d is %s", i, got)
				}
			}
			if res, _ := e.m.Resident(); res != tt.resident-tt.want {
				t.Fatalf("resident = %d, want %d", res, tt.resident-tt.want)
			}
		})
	}

	t.Run("relief ends at the upper bar and the next pass does nothing", func(t *testing.T) {
		e := memoryEnv(t, lifecycle.Config{MinFreeMemory: minFree}, 900, 60)
		for i := range 6 {
			e.seed(t, fmt.Sprintf("s%d", i), lifecycle.Running)
		}
		log := new(eventLog).watch(e)
		wantActions(t, reap(t, e.m), map[string]map[string]int{"pressure": {lifecycle.ActionStop: 4}})
		wantActions(t, reap(t, e.m), nil)
		for _, id := range log.stopped("") {
			if r := e.lastReason(t, id); r != "pressure_memory" {
				t.Fatalf("%s stopped with reason %q, want pressure_memory", id, r)
			}
		}
	})

	t.Run("unreadable memory", func(t *testing.T) {
		e, _ := newClockEnv(t, lifecycle.Config{MinFreeMemory: minFree, MemAvailable: func() (uint64, error) {
			return 0, errors.New("no /proc")
		}})
		e.seed(t, "a", lifecycle.Running)
		wantActions(t, reap(t, e.m), nil)
		wantCalls(t, e.rt, nil)
	})
}

// TestAdmissionMemory: a wake while the host is short of memory first stops
// one idle sandbox.
func TestAdmissionMemory(t *testing.T) {
	tests := []struct {
		name      string
		avail     uint64
		busy      bool
		wantErr   error
		wantCalls map[string]int
	}{
		{"short: evicts one idle first", 500, false, nil, map[string]int{"Stop": 1, "Start": 1}},
		{"short and all busy: refused", 500, true, lifecycle.ErrCapacity, nil},
		{"enough: no eviction", 2000, false, nil, map[string]int{"Start": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, clock := newClockEnv(t, lifecycle.Config{MinFreeMemory: 1000, MemAvailable: func() (uint64, error) { return tt.avail, nil }})
			e.seed(t, "old", lifecycle.Running)
			e.seed(t, "older", lifecycle.Running)
			clock.at(time.Minute)
			e.m.Activity("old").Touch() // older is the least recently active
			if tt.busy {
				e.m.Activity("old").Open()
				e.m.Activity("older").Open()
			}
			e.seed(t, "app1", lifecycle.Stopped)
			log := new(eventLog).watch(e)
			_, err := e.m.Wake(context.Background(), "app1")
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			wantCalls(t, e.rt, tt.wantCalls)
			if _, reserved := e.m.Resident(); reserved != 0 {
				t.Fatalf("%d reservations left", reserved)
			}
			if tt.wantErr != nil {
				if got := e.state(t, "app1"); got != lifecycle.Stopped {
					t.Fatalf("app1 is %s, want stopped", got)
				}
				return
			}
			log.mu.Lock()
			var order []string
			for _, ev := range log.evs {
				order = append(order, ev.SandboxID+":"+string(ev.To)+":"+ev.Reason)
			}
			log.mu.Unlock()
			want := []string{"app1:running:wake"}
			if tt.wantCalls["Stop"] == 1 {
				want = append([]string{"older:stopped:evicted_memory"}, want...)
			}
			if !slices.Equal(order, want) {
				t.Fatalf("events %v, want %v", order, want)
			}
		})
	}
}

// residentWatch follows the resident count through every committed event (so
// that a momentary overshoot is seen, not only the final count) and keeps the
// highest it saw.
type residentWatch struct {
	mu     sync.Mutex
	states map[string]lifecycle.State
	n, max int
}

func watchResident(e *testEnv) *residentWatch {
	w := &residentWatch{states: map[string]lifecycle.State{}}
	e.hooks.onEvent(func(ev lifecycle.Event) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if lifecycle.Resident(w.states[ev.SandboxID]) {
			w.n--
		}
		w.states[ev.SandboxID] = ev.To
		if lifecycle.Resident(ev.To) {
			w.n++
		}
		w.max = max(w.max, w.n)
	})
	return w
}

func (w *residentWatch) highest() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max
}

// TestAdmissionConcurrentWakes: concurrent wakes never take the resident count
// over max_resident; each one either gets room or ErrCapacity, and no
// reservation outlives its wake.
func TestAdmissionConcurrentWakes(t *testing.T) {
	const maxRes, n = 3, 10

	t.Run("starts held until the others are refused", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{MaxResident: maxRes})
		w := watchResident(e)
		for i := range n {
			e.seed(t, fmt.Sprintf("s%d", i), lifecycle.Stopped)
		}
		g := e.rt.Hold(t, "Start", "")
		errs := make(chan error, n)
		for i := range n {
			go func() {
				_, err := e.m.Wake(context.Background(), fmt.Sprintf("s%d", i))
				errs <- err
			}()
		}
		for range maxRes {
			receive(t, g.Entered, "a start")
		}
		// The wakes in flight hold every admission and nothing resident can
		// be evicted: the others are refused while the starts are held.
		for range n - maxRes {
			if err := receive(t, errs, "a refused wake"); !errors.Is(err, lifecycle.ErrCapacity) {
				t.Fatalf("err = %v, want ErrCapacity", err)
			}
		}
		if res, reserved := e.m.Resident(); res != 0 || reserved != maxRes {
			t.Fatalf("resident, reserved = %d, %d; want 0, %d", res, reserved, maxRes)
		}
		g.Release()
		for range maxRes {
			if err := receive(t, errs, "an admitted wake"); err != nil {
				t.Fatal(err)
			}
		}
		if starts := e.rt.Count("Start"); starts != maxRes {
			t.Fatalf("%d starts, want %d", starts, maxRes)
		}
		if res, reserved := e.m.Resident(); res != maxRes || reserved != 0 {
			t.Fatalf("resident, reserved = %d, %d; want %d, 0", res, reserved, maxRes)
		}
		if c := e.m.Counts(); c[lifecycle.Running] != maxRes || c[lifecycle.Stopped] != n-maxRes {
			t.Fatalf("counts = %v", c)
		}
		if h := w.highest(); h != maxRes {
			t.Fatalf("resident peaked at %d, want %d", h, maxRes)
		}
	})

	t.Run("free for all with idle ones to evict", func(t *testing.T) {
		for round := range 5 {
			e := newTestEnv(t, lifecycle.Config{MaxResident: maxRes})
			w := watchResident(e)
			for i := range maxRes {
				e.seed(t, fmt.Sprintf("idle%d", i), lifecycle.Running)
			}
			for i := range n {
				e.seed(t, fmt.Sprintf("s%d", i), lifecycle.Stopped)
			}
			var wg sync.WaitGroup
			var ok, refused atomic.Int32
			errc := make(chan error, n)
			for i := range n {
				wg.Go(func() {
					_, err := e.m.Wake(context.Background(), fmt.Sprintf("s%d", i))
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, lifecycle.ErrCapacity):
						refused.Add(1)
					default:
						errc <- err
					}
				})
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatalf("round %d: wake: %v, want success or ErrCapacity", round, err)
			}
			if ok.Load() == 0 {
				t.Fatalf("round %d: no wake succeeded (%d refused)", round, refused.Load())
			}
			if h := w.highest(); h > maxRes {
				t.Fatalf("round %d: resident peaked at %d, above max_resident %d", round, h, maxRes)
			}
			res, reserved := e.m.Resident()
			if res > maxRes || reserved != 0 {
				t.Fatalf("round %d: resident, reserved = %d, %d", round, res, reserved)
			}
			if c := e.m.Counts(); c[lifecycle.Running]+c[lifecycle.Paused] != res || c[lifecycle.Running]+c[lifecycle.Stopped] != n+maxRes {
				t.Fatalf("round %d: counts = %v, resident %d", round, c, res)
			}
			// Every start made a sandbox resident; every stop an eviction.
			if starts, stops := e.rt.Count("Start"), e.rt.Count("Stop"); starts != int(ok.Load()) || maxRes+starts-stops != res {
				t.Fatalf("round %d: %d starts, %d stops, %d woken, %d resident", round, starts, stops, ok.Load(), res)
			}
		}
	})
}
