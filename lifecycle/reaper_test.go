package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
)

func dur(d time.Duration) *time.Duration { return &d }

// wantActions checks what one reaper pass did, by reaper and action.
func wantActions(t *testing.T, stats lifecycle.ReapStats, want map[string]map[string]int) {
	t.Helper()
	got := map[string]map[string]int{}
	for reaper, byAction := range stats.Actions {
		if len(byAction) > 0 {
			got[reaper] = byAction
		}
	}
	if want == nil {
		want = map[string]map[string]int{}
	}
	if !maps.EqualFunc(got, want, func(a, b map[string]int) bool { return maps.Equal(a, b) }) {
		t.Fatalf("reaper actions = %v, want %v", got, want)
	}
	if stats.Errors != 0 {
		t.Fatalf("reaper pass had %d errors", stats.Errors)
	}
}

// reap runs one reaper pass and fails the test on an error.
func reap(t *testing.T, m *lifecycle.Manager) lifecycle.ReapStats {
	t.Helper()
	stats, err := m.ReapOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return stats
}

// lastReason is the reason of id's newest event.
func (e *testEnv) lastReason(t *testing.T, id string) string {
	t.Helper()
	evs := e.history(t, id)
	return evs[len(evs)-1].Reason
}

func TestReapIdleTiers(t *testing.T) {
	e, clock := newClockEnv(t, lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute})
	e.seed(t, "app1", lifecycle.Running)
	steps := []struct {
		at      time.Duration
		want    lifecycle.State
		calls   map[string]int // runtime calls so far
		actions map[string]map[string]int
	}{
		{0, lifecycle.Running, nil, nil},
		{2 * time.Minute, lifecycle.Running, nil, nil},
		{3*time.Minute - time.Nanosecond, lifecycle.Running, nil, nil},
		{3 * time.Minute, lifecycle.Paused, map[string]int{"Pause": 1}, map[string]map[string]int{"idle": {lifecycle.ActionPause: 1}}},
		{10 * time.Minute, lifecycle.Paused, map[string]int{"Pause": 1}, nil},
		{30*time.Minute - time.Nanosecond, lifecycle.Paused, map[string]int{"Pause": 1}, nil},
		{30 * time.Minute, lifecycle.Stopped, map[string]int{"Pause": 1, "Stop": 1}, map[string]map[string]int{"idle": {lifecycle.ActionStop: 1}}},
		{48 * time.Hour, lifecycle.Stopped, map[string]int{"Pause": 1, "Stop": 1}, nil},
	}
	for _, s := range steps {
		clock.at(s.at)
		stats := reap(t, e.m)
		if stats.Scanned != 1 {
			t.Fatalf("+%s: scanned %d records, want 1", s.at, stats.Scanned)
		}
		wantActions(t, stats, s.actions)
		if got := e.state(t, "app1"); got != s.want {
			t.Fatalf("+%s: state = %s, want %s", s.at, got, s.want)
		}
		wantCalls(t, e.rt, s.calls)
	}
	evs := e.history(t, "app1")
	if len(evs) != 3 ||
		evs[1].From != lifecycle.Running || evs[1].To != lifecycle.Paused || evs[1].Reason != "idle" || !evs[1].At.Equal(testClock.Add(3*time.Minute)) ||
		evs[2].From != lifecycle.Paused || evs[2].To != lifecycle.Stopped || evs[2].Reason != "idle" || !evs[2].At.Equal(testClock.Add(30*time.Minute)) {
		t.Fatalf("events = %+v", evs)
	}
	rec, _ := e.m.Get("app1")
	if !rec.StoppedAt.Equal(testClock.Add(30 * time.Minute)) {
		t.Fatalf("stopped at %v", rec.StoppedAt)
	}
	if res, _ := e.m.Resident(); res != 0 {
		t.Fatalf("resident = %d, want 0", res)
	}
}

func TestReapIdleOverrides(t *testing.T) {
	type step struct {
		at   time.Duration
		want lifecycle.State
	}
	tests := []struct {
		name      string
		cfg       lifecycle.Config
		pause     *time.Duration // spec override (nil: global)
		stop      *time.Duration
		steps     []step
		wantPause int // pause calls at the end
	}{
		{
			name: "global tiers", cfg: lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute},
			steps:     []step{{3 * time.Minute, lifecycle.Paused}, {30 * time.Minute, lifecycle.Stopped}},
			wantPause: 1,
		},
		{
			name: "pause tier off for the sandbox", cfg: lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute},
			pause: dur(0),
			steps: []step{{3 * time.Minute, lifecycle.Running}, {29 * time.Minute, lifecycle.Running}, {30 * time.Minute, lifecycle.Stopped}},
		},
		{
			name: "stop tier off for the sandbox", cfg: lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute},
			stop:      dur(0),
			steps:     []step{{3 * time.Minute, lifecycle.Paused}, {30 * time.Minute, lifecycle.Paused}, {1000 * time.Hour, lifecycle.Paused}},
			wantPause: 1,
		},
		{
			name: "both tiers off for the sandbox", cfg: lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute},
			pause: dur(0), stop: dur(0),
			steps: []step{{3 * time.Minute, lifecycle.Running}, {1000 * time.Hour, lifecycle.Running}},
		},
		{
			name: "shorter tiers for the sandbox", cfg: lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute},
			pause: dur(time.Minute), stop: dur(5 * time.Minute),
			steps:     []step{{time.Minute - 1, lifecycle.Running}, {time.Minute, lifecycle.Paused}, {5*time.Minute - 1, lifecycle.Paused}, {5 * time.Minute, lifecycle.Stopped}},
			wantPause: 1,
		},
		{
			name: "longer tiers for the sandbox", cfg: lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute},
			pause: dur(time.Hour), stop: dur(2 * time.Hour),
			steps:     []step{{30 * time.Minute, lifecycle.Running}, {time.Hour, lifecycle.Paused}, {2 * time.Hour, lifecycle.Stopped}},
			wantPause: 1,
		},
		{
			name: "stop tier shorter than pause tier", cfg: lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute},
			pause: dur(10 * time.Minute), stop: dur(5 * time.Minute),
			steps: []step{{5 * time.Minute, lifecycle.Stopped}},
		},
		{
			name: "pause tier off globally", cfg: lifecycle.Config{IdleStop: 30 * time.Minute},
			steps: []step{{3 * time.Minute, lifecycle.Running}, {29 * time.Minute, lifecycle.Running}, {30 * time.Minute, lifecycle.Stopped}},
		},
		{
			name: "stop tier off globally", cfg: lifecycle.Config{IdlePause: 3 * time.Minute},
			steps:     []step{{3 * time.Minute, lifecycle.Paused}, {1000 * time.Hour, lifecycle.Paused}},
			wantPause: 1,
		},
		{
			name: "both tiers off globally", cfg: lifecycle.Config{},
			steps: []step{{1000 * time.Hour, lifecycle.Running}},
		},
		{
			name: "sandbox turns on a tier that is off globally", cfg: lifecycle.Config{},
			pause: dur(time.Minute), stop: dur(time.Hour),
			steps:     []step{{time.Minute, lifecycle.Paused}, {time.Hour, lifecycle.Stopped}},
			wantPause: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, clock := newClockEnv(t, tt.cfg)
			e.seedWith(t, "app1", lifecycle.Running, func(r *lifecycle.Record) {
				r.Spec.IdlePause, r.Spec.IdleStop = tt.pause, tt.stop
			})
			for _, s := range tt.steps {
				clock.at(s.at)
				reap(t, e.m)
				if got := e.state(t, "app1"); got != s.want {
					t.Fatalf("+%s: state = %s, want %s", s.at, got, s.want)
				}
			}
			if n := e.rt.Count("Pause"); n != tt.wantPause {
				t.Fatalf("%d pause calls, want %d", n, tt.wantPause)
			}
		})
	}
}

// TestReapNeverIdleWhenBusy: an open exchange or a keepalive in the future
// keeps a sandbox awake however long ago its last request was.
func TestReapNeverIdleWhenBusy(t *testing.T) {
	cfg := lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute}
	tests := []struct {
		name  string
		state lifecycle.State
		busy  func(e *testEnv, id string)
	}{
		{"running with an open connection", lifecycle.Running, func(e *testEnv, id string) { e.m.Activity(id).Open() }},
		{"paused with an open connection", lifecycle.Paused, func(e *testEnv, id string) { e.m.Activity(id).Open() }},
		{"running with a keepalive", lifecycle.Running, nil},
		{"paused with a keepalive", lifecycle.Paused, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, clock := newClockEnv(t, cfg)
			e.seedWith(t, "app1", tt.state, func(r *lifecycle.Record) {
				if tt.busy == nil {
					r.KeepaliveUntil = testClock.Add(1000 * time.Hour)
				}
			})
			if tt.busy != nil {
				tt.busy(e, "app1")
			}
			for _, at := range []time.Duration{3 * time.Minute, 30 * time.Minute, 999 * time.Hour} {
				clock.at(at)
				wantActions(t, reap(t, e.m), nil)
				if got := e.state(t, "app1"); got != tt.state {
					t.Fatalf("+%s: state = %s, want %s", at, got, tt.state)
				}
			}
			wantCalls(t, e.rt, nil)
			// Once it is no longer busy, idleness counts again.
			if tt.busy != nil {
				e.m.Activity("app1").Finish() // at +999h
				clock.at(999*time.Hour + 30*time.Minute)
			} else {
				clock.at(1000 * time.Hour)
			}
			wantActions(t, reap(t, e.m), map[string]map[string]int{"idle": {lifecycle.ActionStop: 1}})
			if got := e.state(t, "app1"); got != lifecycle.Stopped {
				t.Fatalf("state = %s, want stopped once idle", got)
			}
		})
	}

	t.Run("keepalive through the API", func(t *testing.T) {
		e, clock := newClockEnv(t, cfg)
		e.seed(t, "app1", lifecycle.Running)
		clock.at(time.Hour)
		if _, err := e.m.Keepalive("app1", 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		for _, at := range []time.Duration{time.Hour + 3*time.Minute, 3*time.Hour - 1} {
			clock.at(at)
			wantActions(t, reap(t, e.m), nil)
		}
		// The keepalive counted as activity at +1h: at +3h the sandbox has
		// been idle 2h, past both tiers.
		clock.at(3 * time.Hour)
		wantActions(t, reap(t, e.m), map[string]map[string]int{"idle": {lifecycle.ActionStop: 1}})
	})
}

func TestReapTouchResetsIdleness(t *testing.T) {
	e, clock := newClockEnv(t, lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute})
	e.seed(t, "app1", lifecycle.Running)
	a := e.m.Activity("app1")
	steps := []struct {
		at    time.Duration
		touch bool
		want  lifecycle.State
	}{
		{2 * time.Minute, true, lifecycle.Running},
		{3 * time.Minute, false, lifecycle.Running},   // idle 1m
		{5*time.Minute - 1, false, lifecycle.Running}, // idle just under 3m
		{5 * time.Minute, false, lifecycle.Paused},    // idle 3m
		{20 * time.Minute, true, lifecycle.Paused},    // touched while paused
		{32 * time.Minute, false, lifecycle.Paused},   // idle 12m: the 30m tier counts from the touch
		{50*time.Minute - 1, false, lifecycle.Paused}, // idle just under 30m
		{50 * time.Minute, false, lifecycle.Stopped},  // idle 30m
		{50*time.Minute + 1, true, lifecycle.Stopped}, // a touch does not wake (the request path does)
		{1000 * time.Hour, false, lifecycle.Stopped},  // and the idle tiers leave stopped sandboxes alone
	}
	for _, s := range steps {
		clock.at(s.at)
		if s.touch {
			a.Touch()
		}
		reap(t, e.m)
		if got := e.state(t, "app1"); got != s.want {
			t.Fatalf("+%s: state = %s, want %s", s.at, got, s.want)
		}
	}
	wantCalls(t, e.rt, map[string]int{"Pause": 1, "Stop": 1})

	t.Run("flushed activity counts too", func(t *testing.T) {
		e, clock := newClockEnv(t, lifecycle.Config{IdlePause: 3 * time.Minute})
		e.seed(t, "app1", lifecycle.Running)
		clock.at(10 * time.Minute)
		e.m.Activity("app1").Touch()
		if err := e.m.FlushActivity(); err != nil {
			t.Fatal(err)
		}
		// A new manager over the same store (a restart) knows only the
		// stored time.
		m, err := lifecycle.NewManager(e.st, e.rt, lifecycle.Config{IdlePause: 3 * time.Minute, Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		clock.at(13*time.Minute - 1)
		wantActions(t, reap(t, m), nil)
		clock.at(13 * time.Minute)
		wantActions(t, reap(t, m), map[string]map[string]int{"idle": {lifecycle.ActionPause: 1}})
	})
}

// TestReapRechecksUnderLock: a request that arrives between candidate
// selection and action keeps the sandbox running, and a sandbox another
// operation holds is skipped rather than waited for.
func TestReapRechecksUnderLock(t *testing.T) {
	cfg := lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute}

	t.Run("touched after the decision", func(t *testing.T) {
		e, clock := newClockEnv(t, cfg)
		e.seed(t, "app1", lifecycle.Running)
		clock.at(3 * time.Minute)
		rec, err := e.m.Get("app1")
		if err != nil {
			t.Fatal(err)
		}
		if reaper, action := e.m.ReapDecision(&rec, clock.Now()); reaper != "idle" || action != lifecycle.ActionPause {
			t.Fatalf("decision = %q %q, want idle pause", reaper, action)
		}
		e.m.Activity("app1").Touch()
		reaper, action, err := e.m.ReapOne(context.Background(), "app1")
		if err != nil || reaper != "" || action != "" {
			t.Fatalf("reapOne = %q, %q, %v; want nothing done", reaper, action, err)
		}
		if got := e.state(t, "app1"); got != lifecycle.Running {
			t.Fatalf("state = %s, want running", got)
		}
		wantCalls(t, e.rt, nil)
	})

	t.Run("connection opened after the decision", func(t *testing.T) {
		e, clock := newClockEnv(t, cfg)
		e.seed(t, "app1", lifecycle.Paused)
		clock.at(30 * time.Minute)
		rec, _ := e.m.Get("app1")
		if _, action := e.m.ReapDecision(&rec, clock.Now()); action != lifecycle.ActionStop {
			t.Fatalf("decision = %q, want stop", action)
		}
		e.m.Activity("app1").Open()
		if _, action, err := e.m.ReapOne(context.Background(), "app1"); err != nil || action != "" {
			t.Fatalf("reapOne = %q, %v; want nothing done", action, err)
		}
		if got := e.state(t, "app1"); got != lifecycle.Paused {
			t.Fatalf("state = %s, want paused", got)
		}
		wantCalls(t, e.rt, nil)
	})

	t.Run("state changed after the decision", func(t *testing.T) {
		e, clock := newClockEnv(t, cfg)
		e.seed(t, "app1", lifecycle.Running)
		clock.at(3 * time.Minute)
		if _, err := e.m.Stop(context.Background(), "app1", "api"); err != nil {
			t.Fatal(err)
		}
		e.rt.ResetCalls()
		if _, action, err := e.m.ReapOne(context.Background(), "app1"); err != nil || action != "" {
			t.Fatalf("reapOne = %q, %v; want nothing done", action, err)
		}
		wantCalls(t, e.rt, nil)
	})

	t.Run("record gone", func(t *testing.T) {
		e, _ := newClockEnv(t, cfg)
		if _, action, err := e.m.ReapOne(context.Background(), "nosuch"); err != nil || action != "" {
			t.Fatalf("reapOne = %q, %v; want nothing done", action, err)
		}
	})

	t.Run("lock held", func(t *testing.T) {
		e, clock := newClockEnv(t, cfg)
		e.seed(t, "app1", lifecycle.Running)
		clock.at(time.Hour)
		unlock := e.m.LockID("app1")
		type result struct {
			reaper, action string
			err            error
		}
		done := make(chan result, 1)
		go func() {
			r, a, err := e.m.ReapOne(context.Background(), "app1")
			done <- result{r, a, err}
		}()
		if res := receive(t, done, "reapOne to return while the lock is held"); res.err != nil || res.action != "" {
			t.Fatalf("reapOne = %+v; want nothing done", res)
		}
		stats, err := e.m.ReapOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		wantActions(t, stats, nil)
		wantCalls(t, e.rt, nil)
		unlock()
		// Skipped, not forgotten: the next pass acts.
		wantActions(t, reap(t, e.m), map[string]map[string]int{"idle": {lifecycle.ActionStop: 1}})
	})
}

func TestReapExpiry(t *testing.T) {
	for _, from := range []lifecycle.State{lifecycle.Running, lifecycle.Paused, lifecycle.Stopped, lifecycle.Killed, lifecycle.Error} {
		t.Run("from_"+string(from), func(t *testing.T) {
			e, clock := newClockEnv(t, lifecycle.Config{MaxLifetime: time.Hour})
			e.seed(t, "app1", from)
			hadVolume := e.rt.HasVolume("app1")
			clock.at(time.Hour - 1)
			wantActions(t, reap(t, e.m), nil)
			wantCalls(t, e.rt, nil)
			clock.at(time.Hour)
			wantActions(t, reap(t, e.m), map[string]map[string]int{"expiry": {lifecycle.ActionExpire: 1}})
			wantCalls(t, e.rt, map[string]int{"Remove": 1})
			rec, err := e.m.Get("app1")
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != lifecycle.Expired || rec.Reason != "max_lifetime" || rec.ContainerID != "" || rec.Upstreams != nil ||
				!rec.VerifiedAt.Equal(testClock.Add(time.Hour)) {
				t.Fatalf("record = %+v", rec)
			}
			if got := e.rt.ContainerState("app1"); got != "" {
				t.Fatalf("container is %s, want removed", got)
			}
			if e.rt.HasVolume("app1") != hadVolume {
				t.Fatal("expiry removed the volume")
			}
			if res, _ := e.m.Resident(); res != 0 {
				t.Fatalf("resident = %d, want 0", res)
			}
			// Expired is final for the reaper.
			clock.at(1000 * time.Hour)
			wantActions(t, reap(t, e.m), nil)
			wantCalls(t, e.rt, map[string]int{"Remove": 1})
		})
	}
	for _, from := range []lifecycle.State{lifecycle.Creating, lifecycle.Expired} {
		t.Run("not_from_"+string(from), func(t *testing.T) {
			e, clock := newClockEnv(t, lifecycle.Config{MaxLifetime: time.Hour})
			e.seed(t, "app1", from)
			clock.at(1000 * time.Hour)
			wantActions(t, reap(t, e.m), nil)
			wantCalls(t, e.rt, nil)
			if got := e.state(t, "app1"); got != from {
				t.Fatalf("state = %s, want %s", got, from)
			}
		})
	}

	overrides := []struct {
		name   string
		global time.Duration
		life   *time.Duration
		at     time.Duration
		want   lifecycle.State
	}{
		{"shorter for the sandbox", time.Hour, dur(10 * time.Minute), 10 * time.Minute, lifecycle.Expired},
		{"longer for the sandbox", time.Hour, dur(2 * time.Hour), 2*time.Hour - 1, lifecycle.Running},
		{"off for the sandbox", time.Hour, dur(0), 1000 * time.Hour, lifecycle.Running},
		{"off globally", 0, nil, 1000 * time.Hour, lifecycle.Running},
		{"on for the sandbox only", 0, dur(time.Hour), time.Hour, lifecycle.Expired},
	}
	for _, tt := range overrides {
		t.Run(tt.name, func(t *testing.T) {
			e, clock := newClockEnv(t, lifecycle.Config{MaxLifetime: tt.global})
			e.seedWith(t, "app1", lifecycle.Running, func(r *lifecycle.Record) { r.Spec.MaxLifetime = tt.life })
			clock.at(tt.at)
			reap(t, e.m)
			if got := e.state(t, "app1"); got != tt.want {
				t.Fatalf("state = %s, want %s", got, tt.want)
			}
		})
	}

	t.Run("expiry comes before the idle tiers", func(t *testing.T) {
		e, clock := newClockEnv(t, lifecycle.Config{MaxLifetime: time.Hour, IdlePause: time.Minute, IdleStop: time.Minute})
		e.seed(t, "app1", lifecycle.Running)
		clock.at(time.Hour)
		wantActions(t, reap(t, e.m), map[string]map[string]int{"expiry": {lifecycle.ActionExpire: 1}})
		wantCalls(t, e.rt, map[string]int{"Remove": 1})
	})

	t.Run("engine unavailable", func(t *testing.T) {
		e, clock := newClockEnv(t, lifecycle.Config{MaxLifetime: time.Hour})
		e.seed(t, "app1", lifecycle.Running)
		e.rt.FailWith("Remove", fmt.Errorf("docker: %w", lifecycle.ErrUnavailable))
		clock.at(time.Hour)
		stats := reap(t, e.m)
		if stats.Errors != 1 || stats.Total() != 0 {
			t.Fatalf("stats = %+v, want one error and no action", stats)
		}
		if got := e.state(t, "app1"); got != lifecycle.Running {
			t.Fatalf("state = %s, want running", got)
		}
	})
}

func TestWakeExpired(t *testing.T) {
	expire := func(t *testing.T, e *testEnv, clock *fakeClock) {
		t.Helper()
		e.seed(t, "app1", lifecycle.Running)
		clock.at(time.Hour)
		wantActions(t, reap(t, e.m), map[string]map[string]int{"expiry": {lifecycle.ActionExpire: 1}})
		e.rt.ResetCalls()
	}

	t.Run("recreate by default", func(t *testing.T) {
		e, clock := newClockEnv(t, lifecycle.Config{MaxLifetime: time.Hour})
		expire(t, e, clock)
		rec, err := e.m.Wake(context.Background(), "app1")
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != lifecycle.Running || rec.Reason != "recreate" || rec.ContainerID == "" || len(rec.Upstreams) == 0 {
			t.Fatalf("record = %+v", rec)
		}
		wantCalls(t, e.rt, map[string]int{"Create": 1, "Start": 1})
		if got := e.rt.ContainerState("app1"); got != lifecycle.ContainerRunning {
			t.Fatalf("container is %s, want running", got)
		}
	})

	t.Run("refuse", func(t *testing.T) {
		e, clock := newClockEnv(t, lifecycle.Config{MaxLifetime: time.Hour, ExpiredWake: lifecycle.ExpiredWakeRefuse})
		expire(t, e, clock)
		if _, err := e.m.Wake(context.Background(), "app1"); !errors.Is(err, lifecycle.ErrConflict) {
			t.Fatalf("err = %v, want ErrConflict", err)
		}
		wantCalls(t, e.rt, nil)
		if got := e.state(t, "app1"); got != lifecycle.Expired {
			t.Fatalf("state = %s, want expired", got)
		}
	})

	t.Run("refuse after a reload", func(t *testing.T) {
		e, clock := newClockEnv(t, lifecycle.Config{MaxLifetime: time.Hour})
		expire(t, e, clock)
		e.m.Reconfigure(lifecycle.Settings{MaxLifetime: time.Hour, ExpiredWake: lifecycle.ExpiredWakeRefuse})
		if _, err := e.m.Wake(context.Background(), "app1"); !errors.Is(err, lifecycle.ErrConflict) {
			t.Fatalf("err = %v, want ErrConflict", err)
		}
		wantCalls(t, e.rt, nil)
	})
}

// TestExpiredWakeRecreateGetsANewLifetime: a sandbox recreated by a wake after
// it expired must not be expired again by the very next reaper pass.
// Reported bug: reapDecision measures the lifetime from Record.CreatedAt,
// which nothing updates on a recreate, so with expired_wake recreate (the
// default) the recreated sandbox lives one reap_interval at most.
func TestExpiredWakeRecreateGetsANewLifetime(t *testing.T) {
	e, clock := newClockEnv(t, lifecycle.Config{MaxLifetime: time.Hour})
	e.seed(t, "app1", lifecycle.Running)
	clock.at(time.Hour)
	wantActions(t, reap(t, e.m), map[string]map[string]int{"expiry": {lifecycle.ActionExpire: 1}})
	if _, err := e.m.Wake(context.Background(), "app1"); err != nil {
		t.Fatal(err)
	}
	clock.at(time.Hour + 10*time.Second) // the next pass at the default reap_interval
	reap(t, e.m)
	if got := e.state(t, "app1"); got != lifecycle.Running {
		t.Fatalf("sandbox recreated at +1h is %s at +1h10s (reason %q), want running until +2h",
			got, e.lastReason(t, "app1"))
	}
}

// TestReapResidentPass: the passes between full ones read the running and
// paused sandboxes alone, and decide their idle tiers and expiry as a full
// pass does; a stopped sandbox's expiry waits for the next full pass.
func TestReapResidentPass(t *testing.T) {
	e, clock := newClockEnv(t, lifecycle.Config{IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute, MaxLifetime: time.Hour})
	for i := range 40 {
		e.seed(t, fmt.Sprintf("cold%02d", i), lifecycle.Stopped)
	}
	e.seed(t, "hot", lifecycle.Running)
	e.seed(t, "warm", lifecycle.Paused)
	e.seed(t, "old", lifecycle.Running)

	clock.at(3 * time.Minute)
	stats, err := e.m.ReapResidentOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if stats.Scanned != 3 {
		t.Fatalf("a resident pass read %d records, want the 3 running or paused", stats.Scanned)
	}
	wantActions(t, stats, map[string]map[string]int{"idle": {lifecycle.ActionPause: 2}})
	if got := e.state(t, "hot"); got != lifecycle.Paused {
		t.Fatalf("hot after a resident pass at +3m: %s, want paused", got)
	}

	// Past the lifetime: resident sandboxes expire in a resident pass,
	// stopped ones in the next full pass.
	clock.at(time.Hour)
	stats, err = e.m.ReapResidentOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, stats, map[string]map[string]int{"expiry": {lifecycle.ActionExpire: 3}})
	if got := e.state(t, "cold07"); got != lifecycle.Stopped {
		t.Fatalf("a stopped sandbox after a resident pass: %s, want stopped until a full pass", got)
	}
	stats = reap(t, e.m)
	if stats.Scanned != 43 {
		t.Fatalf("a full pass read %d records, want 43", stats.Scanned)
	}
	wantActions(t, stats, map[string]map[string]int{"expiry": {lifecycle.ActionExpire: 40}})
}

// noPause is the fake engine as one that cannot freeze a sandbox
// (Kubernetes): lifecycle.Pauser says so.
type noPause struct{ *lifecycletest.Runtime }

func (noPause) CanPause() bool     { return false }
func (noPause) PauseFreezes() bool { return false }

func TestIdlePauseStopsOnRuntimeWithoutPause(t *testing.T) {
	clock := newFakeClock()
	e := newTestEnvWith(t, lifecycle.Config{Now: clock.Now, IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute},
		func(rt *lifecycletest.Runtime) lifecycle.Runtime { return noPause{rt} })
	e.seed(t, "app1", lifecycle.Running)
	e.seed(t, "app2", lifecycle.Running)
	clock.at(3*time.Minute - time.Nanosecond)
	wantActions(t, reap(t, e.m), nil)
	clock.at(3 * time.Minute)
	// The pause tier collapses to a stop, for both sandboxes.
	wantActions(t, reap(t, e.m), map[string]map[string]int{"idle": {lifecycle.ActionStop: 2}})
	for _, id := range []string{"app1", "app2"} {
		if got := e.state(t, id); got != lifecycle.Stopped {
			t.Fatalf("%s: state = %s, want stopped", id, got)
		}
	}
	if n := e.rt.Count("Pause"); n != 0 {
		t.Fatalf("Pause called %d times on a runtime that cannot pause", n)
	}
	// The API's pause is refused without an engine call, as a conflict.
	e.seed(t, "app3", lifecycle.Running)
	_, err := e.m.Pause(context.Background(), "app3", "api")
	if !errors.Is(err, lifecycle.ErrPauseUnsupported) || !errors.Is(err, lifecycle.ErrConflict) {
		t.Fatalf("pause = %v, want ErrPauseUnsupported (a conflict)", err)
	}
	if got := e.state(t, "app3"); got != lifecycle.Running {
		t.Fatalf("app3: state = %s after a refused pause, want running", got)
	}
	if n := e.rt.Count("Pause"); n != 0 {
		t.Fatalf("Pause called %d times on a runtime that cannot pause", n)
	}
}

// pauseRefuses is the fake engine as one that can pause, but not one
// sandbox (Kubernetes: a pod whose CPU no resize can cut).
type pauseRefuses struct {
	*lifecycletest.Runtime
	refused string
}

func (p pauseRefuses) Pause(ctx context.Context, id string) error {
	if id == p.refused {
		return fmt.Errorf("pausing sandbox %s: %w", id, lifecycle.ErrPauseUnsupported)
	}
	return p.Runtime.Pause(ctx, id)
}

func TestIdlePauseStopsASandboxTheRuntimeCannotPause(t *testing.T) {
	clock := newFakeClock()
	e := newTestEnvWith(t, lifecycle.Config{Now: clock.Now, IdlePause: 3 * time.Minute, IdleStop: 30 * time.Minute},
		func(rt *lifecycletest.Runtime) lifecycle.Runtime { return pauseRefuses{Runtime: rt, refused: "old1"} })
	e.seed(t, "app1", lifecycle.Running)
	e.seed(t, "old1", lifecycle.Running)
	clock.at(3 * time.Minute)
	stats := reap(t, e.m)
	if stats.Errors != 0 {
		t.Fatalf("%d reaper errors, want 0 (a refused pause stops the sandbox)", stats.Errors)
	}
	wantActions(t, stats, map[string]map[string]int{"idle": {lifecycle.ActionPause: 1, lifecycle.ActionStop: 1}})
	if got := e.state(t, "app1"); got != lifecycle.Paused {
		t.Fatalf("app1: state = %s, want paused", got)
	}
	if got := e.state(t, "old1"); got != lifecycle.Stopped {
		t.Fatalf("old1: state = %s, want stopped (its pause was refused)", got)
	}
}
