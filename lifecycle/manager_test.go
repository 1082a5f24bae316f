package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"

	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
)

func wantCalls(t *testing.T, rt *lifecycletest.Runtime, want map[string]int) {
	t.Helper()
	if got := rt.Calls(); !maps.Equal(got, want) {
		t.Fatalf("runtime calls = %v, want %v", got, want)
	}
}

func TestTransitionTable(t *testing.T) {
	tests := []struct {
		from, to lifecycle.State
		want     bool
	}{
		{lifecycle.Creating, lifecycle.Running, true},
		{lifecycle.Creating, lifecycle.Error, true},
		{lifecycle.Creating, lifecycle.Killed, true},
		{lifecycle.Creating, lifecycle.Paused, false},
		{lifecycle.Creating, lifecycle.Stopped, false},
		{lifecycle.Running, lifecycle.Paused, true},
		{lifecycle.Running, lifecycle.Stopped, true},
		{lifecycle.Running, lifecycle.Running, true}, // records new upstreams
		{lifecycle.Running, lifecycle.Creating, false},
		{lifecycle.Paused, lifecycle.Running, true},
		{lifecycle.Paused, lifecycle.Stopped, true},
		{lifecycle.Stopped, lifecycle.Running, true},
		{lifecycle.Stopped, lifecycle.Paused, true},
		{lifecycle.Stopped, lifecycle.Stopped, false},
		{lifecycle.Killed, lifecycle.Running, true},
		{lifecycle.Killed, lifecycle.Paused, false},
		{lifecycle.Killed, lifecycle.Expired, true},
		{lifecycle.Expired, lifecycle.Running, true},
		{lifecycle.Expired, lifecycle.Stopped, false},
		{lifecycle.Expired, lifecycle.Killed, false},
		{lifecycle.Error, lifecycle.Running, true},
		{lifecycle.Error, lifecycle.Stopped, true},
		{lifecycle.Error, lifecycle.Paused, false},
		{lifecycle.Error, lifecycle.Creating, false},
		{"bogus", lifecycle.Running, false},
		{lifecycle.Running, "bogus", false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s_to_%s", tt.from, tt.to), func(t *testing.T) {
			if got := lifecycle.CanTransition(tt.from, tt.to); got != tt.want {
				t.Fatalf("CanTransition(%s, %s) = %v, want %v", tt.from, tt.to, got, tt.want)
			}
		})
	}

	t.Run("every state has an entry", func(t *testing.T) {
		table := lifecycle.TransitionTable()
		if len(table) != len(lifecycle.States) {
			t.Fatalf("table has %d entries, States has %d", len(table), len(lifecycle.States))
		}
		for _, s := range lifecycle.States {
			if _, ok := table[s]; !ok {
				t.Errorf("no entry for %s", s)
			}
			if !lifecycle.ValidState(s) {
				t.Errorf("ValidState(%s) = false", s)
			}
			for _, from := range lifecycle.AllowedFrom(s) {
				if !lifecycle.ValidState(from) {
					t.Errorf("%s allowed from unknown state %q", s, from)
				}
			}
		}
	})
	t.Run("creating has no way in", func(t *testing.T) {
		if got := lifecycle.AllowedFrom(lifecycle.Creating); len(got) != 0 {
			t.Fatalf("AllowedFrom(creating) = %v, want none", got)
		}
		for _, s := range lifecycle.States {
			if lifecycle.CanTransition(s, lifecycle.Creating) {
				t.Errorf("%s → creating allowed", s)
			}
		}
	})
	t.Run("resident", func(t *testing.T) {
		for _, s := range lifecycle.States {
			if want := s == lifecycle.Running || s == lifecycle.Paused; lifecycle.Resident(s) != want {
				t.Errorf("Resident(%s) = %v, want %v", s, !want, want)
			}
		}
	})
}

func TestCreate(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	life := 2 * time.Hour
	spec := testSpec()
	spec.MaxLifetime = &life
	rec, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app1", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if rec.ID != "app1" || rec.State != lifecycle.Running || rec.Reason != "create" || rec.Error != "" {
		t.Fatalf("record = %+v", rec)
	}
	if got, want := rec.Upstreams[testPort], e.srv.Listener.Addr().String(); got != want {
		t.Fatalf("upstream = %q, want %q", got, want)
	}
	if rec.ContainerID == "" || !rec.VerifiedAt.Equal(testClock) || !rec.CreatedAt.Equal(testClock) {
		t.Fatalf("record = %+v", rec)
	}
	if !rec.ExpiresAt.Equal(testClock.Add(life)) {
		t.Fatalf("expires at %v, want %v", rec.ExpiresAt, testClock.Add(life))
	}
	if rec.Spec.WorkspacePath != lifecycle.DefaultWorkspacePath || rec.Spec.ReadyMode != lifecycle.ReadyHTTP || rec.Spec.Access != lifecycle.AccessPublic {
		t.Fatalf("spec defaults not filled: %+v", rec.Spec)
	}
	// The create asked whether a kept volume of the id exists (whose).
	wantCalls(t, e.rt, map[string]int{"VolumeOwner": 1, "Create": 1, "Start": 1})
	evs := e.history(t, "app1")
	if len(evs) != 2 ||
		evs[0].Type != "sandbox.creating" || evs[0].From != "" || evs[0].To != lifecycle.Creating ||
		evs[1].Type != "sandbox.running" || evs[1].From != lifecycle.Creating || evs[1].To != lifecycle.Running || evs[1].Reason != "create" {
		t.Fatalf("events = %+v", evs)
	}
	if res, _ := e.m.Resident(); res != 1 {
		t.Fatalf("resident = %d, want 1", res)
	}
	if got, err := e.m.Get("app1"); err != nil || got.State != lifecycle.Running {
		t.Fatalf("Get = %+v, %v", got, err)
	}
}

func TestCreateRefused(t *testing.T) {
	noPorts := testSpec()
	noPorts.Ports = nil
	noImage := testSpec()
	noImage.Image = " "
	tests := []struct {
		name string
		req  lifecycle.CreateRequest
	}{
		{"dash in id", lifecycle.CreateRequest{ID: "my-app", Spec: testSpec()}},
		{"underscore in id", lifecycle.CreateRequest{ID: "my_app", Spec: testSpec()}},
		{"id too long", lifecycle.CreateRequest{ID: strings.Repeat("a", lifecycle.MaxIDLen+1), Spec: testSpec()}},
		{"non-ascii id", lifecycle.CreateRequest{ID: "appé", Spec: testSpec()}},
		{"no ports", lifecycle.CreateRequest{ID: "app1", Spec: noPorts}},
		{"no image", lifecycle.CreateRequest{ID: "app1", Spec: noImage}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			_, err := e.m.Create(context.Background(), tt.req)
			if !errors.Is(err, lifecycle.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			recs, err := e.m.List("")
			if err != nil || len(recs) != 0 {
				t.Fatalf("records = %v, %v; want none", recs, err)
			}
			if last, _ := e.st.LastEventID(); last != 0 {
				t.Fatalf("last event id = %d, want no events", last)
			}
			wantCalls(t, e.rt, nil)
			if res, reserved := e.m.Resident(); res != 0 || reserved != 0 {
				t.Fatalf("resident, reserved = %d, %d", res, reserved)
			}
		})
	}
}

func TestCreateDuplicate(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	if _, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app1", Spec: testSpec()}); err != nil {
		t.Fatal(err)
	}
	e.rt.ResetCalls()
	// The id is folded before the check, so another case is the same id.
	for _, id := range []string{"app1", "APP1"} {
		_, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: id, Spec: testSpec()})
		if !errors.Is(err, lifecycle.ErrExists) {
			t.Fatalf("create %s: err = %v, want ErrExists", id, err)
		}
	}
	wantCalls(t, e.rt, nil)
	if n := len(e.history(t, "app1")); n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
	if res, reserved := e.m.Resident(); res != 1 || reserved != 0 {
		t.Fatalf("resident, reserved = %d, %d; want 1, 0", res, reserved)
	}
}

func TestCreateID(t *testing.T) {
	tests := []struct {
		name, id string
		want     string // "" means a new ULID
	}{
		{"lower case kept", "app1", "app1"},
		{"upper case folded", "MyApp42", "myapp42"},
		{"empty gets a ulid", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			rec, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: tt.id, Spec: testSpec()})
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if len(rec.ID) != 26 || !lifecycle.ValidID(rec.ID) {
					t.Fatalf("id = %q, want a 26-character lowercase ulid", rec.ID)
				}
			} else if rec.ID != tt.want {
				t.Fatalf("id = %q, want %q", rec.ID, tt.want)
			}
			if _, err := e.m.Get(rec.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestCreateFailure(t *testing.T) {
	tests := []struct {
		name       string
		cfg        lifecycle.Config
		setup      func(t *testing.T, rt *lifecycletest.Runtime)
		wantErr    error
		wantReason string
	}{
		{
			name:       "start fails",
			setup:      func(t *testing.T, rt *lifecycletest.Runtime) { rt.FailWith("Start", errors.New("exec format error")) },
			wantReason: "start_failed",
		},
		{
			name:       "no upstream for the first port",
			setup:      func(t *testing.T, rt *lifecycletest.Runtime) { rt.SetUpstreams(map[int]string{9999: "127.0.0.1:1"}) },
			wantReason: "start_failed",
		},
		{
			name: "never ready",
			cfg:  lifecycle.Config{WakeTimeout: 200 * time.Millisecond},
			setup: func(t *testing.T, rt *lifecycletest.Runtime) {
				rt.SetUpstreams(map[int]string{testPort: closedAddr(t)})
			},
			wantErr:    lifecycle.ErrNotReady,
			wantReason: "not_ready",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, tt.cfg)
			tt.setup(t, e.rt)
			_, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app1", Spec: testSpec()})
			if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			rec, err := e.m.Get("app1")
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != lifecycle.Error || rec.Reason != tt.wantReason || rec.Error == "" {
				t.Fatalf("record state %s reason %q error %q; want error, %q and a message", rec.State, rec.Reason, rec.Error, tt.wantReason)
			}
			evs := e.history(t, "app1")
			if len(evs) != 2 || evs[1].From != lifecycle.Creating || evs[1].To != lifecycle.Error || evs[1].Reason != tt.wantReason {
				t.Fatalf("events = %+v", evs)
			}
			// A failed sandbox must not keep a container running.
			if s := e.rt.ContainerState("app1"); s == lifecycle.ContainerRunning {
				t.Fatalf("container left %s", s)
			}
			if res, reserved := e.m.Resident(); res != 0 || reserved != 0 {
				t.Fatalf("resident, reserved = %d, %d; want 0, 0", res, reserved)
			}
		})
	}
}

// TestCreateRefusedLeavesNothing: a create the engine refuses before making
// anything (image missing, name taken by someone else, spec refused) leaves
// no record behind and the id free.
func TestCreateRefusedLeavesNothing(t *testing.T) {
	for _, cause := range []error{lifecycle.ErrImageNotFound, lifecycle.ErrIDTaken, lifecycle.ErrInvalid} {
		t.Run(cause.Error(), func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			e.rt.FailWith("Create", fmt.Errorf("engine says: %w", cause))
			_, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app1", Spec: testSpec()})
			if !errors.Is(err, cause) {
				t.Fatalf("err = %v, want %v", err, cause)
			}
			if _, err := e.m.Get("app1"); !errors.Is(err, lifecycle.ErrNotFound) {
				t.Fatalf("record left: %v", err)
			}
			if n := e.m.Counts(); len(n) != 0 {
				t.Fatalf("state counts %v, want none", n)
			}
			if res, reserved := e.m.Resident(); res != 0 || reserved != 0 {
				t.Fatalf("resident, reserved = %d, %d; want 0, 0", res, reserved)
			}
			// The id is free: the next create of it succeeds.
			e.rt.FailWith("Create", nil)
			if _, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app1", Spec: testSpec()}); err != nil {
				t.Fatalf("create after a refused one: %v", err)
			}
		})
	}
}

// TestCreateRefusedAtStartUnmakes: a create whose start the engine
// refuses (Kubernetes: a pod whose image no node has, known only once the
// pod is made) removes the container and the fresh volume the create made,
// and leaves no record; the id is free.
func TestCreateRefusedAtStartUnmakes(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	e.rt.FailWith("Start", fmt.Errorf("pod s-app1: ErrImageNeverPull: %w", lifecycle.ErrImageNotFound))
	_, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app1", Spec: testSpec()})
	if !errors.Is(err, lifecycle.ErrImageNotFound) {
		t.Fatalf("err = %v, want ErrImageNotFound", err)
	}
	if _, err := e.m.Get("app1"); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("record left: %v", err)
	}
	if e.rt.Count("Remove") != 1 || e.rt.Count("RemoveVolume") != 1 || e.rt.HasVolume("app1") {
		t.Fatalf("calls %v, volume left %v: want the container and the fresh volume removed", e.rt.Calls(), e.rt.HasVolume("app1"))
	}
	if _, err := e.rt.Inspect(context.Background(), "app1"); !errors.Is(err, lifecycle.ErrContainerNotFound) {
		t.Fatalf("container left: %v", err)
	}
	e.rt.FailWith("Start", nil)
	if _, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app1", Spec: testSpec()}); err != nil {
		t.Fatalf("create after a refused one: %v", err)
	}
}

func TestWake(t *testing.T) {
	tests := []struct {
		from       lifecycle.State
		wantCalls  map[string]int
		wantReason string // "" when no transition is expected
		wantErr    error
	}{
		{from: lifecycle.Running, wantCalls: nil},
		{from: lifecycle.Paused, wantCalls: map[string]int{"Unpause": 1}, wantReason: "wake"},
		{from: lifecycle.Stopped, wantCalls: map[string]int{"Start": 1}, wantReason: "wake"},
		{from: lifecycle.Killed, wantCalls: map[string]int{"Create": 1, "Start": 1}, wantReason: "recreate"},
		{from: lifecycle.Expired, wantCalls: map[string]int{"Create": 1, "Start": 1}, wantReason: "recreate"},
		{from: lifecycle.Error, wantCalls: map[string]int{"Create": 1, "Start": 1}, wantReason: "recreate"},
		{from: lifecycle.Creating, wantCalls: nil, wantErr: lifecycle.ErrConflict},
	}
	for _, tt := range tests {
		t.Run(string(tt.from), func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			e.seed(t, "app1", tt.from)
			if tt.from == lifecycle.Error {
				if _, err := e.st.Update("app1", func(r *lifecycle.Record) error { r.Error = "earlier failure"; return nil }); err != nil {
					t.Fatal(err)
				}
			}
			var woken []lifecycle.WakeResult
			e.hooks.onWake(func(r lifecycle.WakeResult) { woken = append(woken, r) })
			rec, err := e.m.Wake(context.Background(), "app1")
			wantCalls(t, e.rt, tt.wantCalls)
			evs := e.history(t, "app1")
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if got := e.state(t, "app1"); got != tt.from || len(evs) != 1 {
					t.Fatalf("state %s with %d events, want %s unchanged", got, len(evs), tt.from)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != lifecycle.Running || rec.Error != "" {
				t.Fatalf("record = %+v", rec)
			}
			if got, want := rec.Upstreams[testPort], e.srv.Listener.Addr().String(); got != want {
				t.Fatalf("upstream = %q, want %q", got, want)
			}
			if res, _ := e.m.Resident(); res != 1 {
				t.Fatalf("resident = %d, want 1", res)
			}
			if tt.wantReason == "" {
				if len(evs) != 1 || len(woken) != 0 {
					t.Fatalf("waking a running sandbox made %d events and %d wake reports", len(evs)-1, len(woken))
				}
				return
			}
			last := evs[len(evs)-1]
			if len(evs) != 2 || last.From != tt.from || last.To != lifecycle.Running || last.Reason != tt.wantReason {
				t.Fatalf("events = %+v", evs)
			}
			if rec.ContainerID == "" || !rec.VerifiedAt.Equal(testClock) {
				t.Fatalf("record = %+v", rec)
			}
			if len(woken) != 1 || woken[0].ID != "app1" || woken[0].From != tt.from || woken[0].Err != nil {
				t.Fatalf("wake reports = %+v", woken)
			}
		})
	}

	t.Run("unknown", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{})
		if _, err := e.m.Wake(context.Background(), "nosuch"); !errors.Is(err, lifecycle.ErrNotFound) {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
		wantCalls(t, e.rt, nil)
	})
}

// TestWakeStaleRecord covers records that no longer match the engine: the
// wake acts on what Inspect shows.
func TestWakeStaleRecord(t *testing.T) {
	tests := []struct {
		name       string
		record     lifecycle.State
		container  lifecycle.ContainerState // "" means no container
		wantCalls  map[string]int
		wantReason string
	}{
		{"paused record, running container", lifecycle.Paused, lifecycle.ContainerRunning, map[string]int{"Unpause": 1, "Inspect": 1}, "wake"},
		{"paused record, exited container", lifecycle.Paused, lifecycle.ContainerExited, map[string]int{"Unpause": 1, "Inspect": 1, "Start": 1}, "wake"},
		{"paused record, created container", lifecycle.Paused, lifecycle.ContainerCreated, map[string]int{"Unpause": 1, "Inspect": 1, "Start": 1}, "wake"},
		{"paused record, no container", lifecycle.Paused, "", map[string]int{"Unpause": 1, "Inspect": 1, "Create": 1, "Start": 1}, "recreate"},
		{"stopped record, paused container", lifecycle.Stopped, lifecycle.ContainerPaused, map[string]int{"Start": 1, "Inspect": 1, "Unpause": 1}, "wake"},
		{"stopped record, no container", lifecycle.Stopped, "", map[string]int{"Start": 2, "Inspect": 1, "Create": 1}, "recreate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			e.seed(t, "app1", tt.record)
			e.rt.Put("app1", tt.container)
			rec, err := e.m.Wake(context.Background(), "app1")
			if err != nil {
				t.Fatal(err)
			}
			wantCalls(t, e.rt, tt.wantCalls)
			if rec.State != lifecycle.Running || rec.Reason != tt.wantReason {
				t.Fatalf("state %s reason %q, want running %q", rec.State, rec.Reason, tt.wantReason)
			}
			if s := e.rt.ContainerState("app1"); s != lifecycle.ContainerRunning {
				t.Fatalf("container is %s, want running", s)
			}
			if got, want := rec.Upstreams[testPort], e.srv.Listener.Addr().String(); got != want {
				t.Fatalf("upstream = %q, want %q", got, want)
			}
		})
	}
}

func TestWakeFailure(t *testing.T) {
	unavailable := fmt.Errorf("docker: %w", lifecycle.ErrUnavailable)
	tests := []struct {
		name       string
		from       lifecycle.State
		cfg        lifecycle.Config
		setup      func(t *testing.T, e *testEnv)
		wantErr    error
		wantCalls  map[string]int
		wantReason string // "" means transient: record and events unchanged
	}{
		{
			name:      "start unavailable",
			from:      lifecycle.Stopped,
			setup:     func(t *testing.T, e *testEnv) { e.rt.FailWith("Start", unavailable) },
			wantErr:   lifecycle.ErrUnavailable,
			wantCalls: map[string]int{"Start": 1},
		},
		{
			name:      "unpause unavailable",
			from:      lifecycle.Paused,
			setup:     func(t *testing.T, e *testEnv) { e.rt.FailWith("Unpause", unavailable) },
			wantErr:   lifecycle.ErrUnavailable,
			wantCalls: map[string]int{"Unpause": 1},
		},
		{
			name:      "create unavailable",
			from:      lifecycle.Killed,
			setup:     func(t *testing.T, e *testEnv) { e.rt.FailWith("Create", unavailable) },
			wantErr:   lifecycle.ErrUnavailable,
			wantCalls: map[string]int{"Create": 1},
		},
		{
			name: "inspect unavailable after a definitive start failure",
			from: lifecycle.Stopped,
			setup: func(t *testing.T, e *testEnv) {
				e.rt.FailWith("Start", errors.New("boom"))
				e.rt.FailWith("Inspect", unavailable)
			},
			wantErr:   lifecycle.ErrUnavailable,
			wantCalls: map[string]int{"Start": 1, "Inspect": 1},
		},
		{
			name:       "start fails",
			from:       lifecycle.Stopped,
			setup:      func(t *testing.T, e *testEnv) { e.rt.FailWith("Start", errors.New("boom")) },
			wantCalls:  map[string]int{"Start": 2, "Inspect": 1, "Stop": 1},
			wantReason: "start_failed",
		},
		{
			name: "image missing",
			from: lifecycle.Expired,
			setup: func(t *testing.T, e *testEnv) {
				e.rt.FailWith("Create", fmt.Errorf("pull: %w", lifecycle.ErrImageNotFound))
			},
			wantErr:    lifecycle.ErrImageNotFound,
			wantCalls:  map[string]int{"Create": 1, "Stop": 1},
			wantReason: "image_missing",
		},
		{
			name: "container restarting",
			from: lifecycle.Stopped,
			setup: func(t *testing.T, e *testEnv) {
				e.rt.Put("app1", lifecycle.ContainerRestarting)
				e.rt.FailWith("Start", errors.New("boom"))
			},
			wantCalls:  map[string]int{"Start": 1, "Inspect": 1, "Stop": 1},
			wantReason: "start_failed",
		},
		{
			name: "paused, never ready",
			from: lifecycle.Paused,
			cfg:  lifecycle.Config{WakeTimeout: 200 * time.Millisecond},
			setup: func(t *testing.T, e *testEnv) {
				if _, err := e.st.Update("app1", func(r *lifecycle.Record) error {
					r.Upstreams = map[int]string{testPort: closedAddr(t)}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			},
			wantErr:    lifecycle.ErrNotReady,
			wantCalls:  map[string]int{"Unpause": 1, "Stop": 1},
			wantReason: "not_ready",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, tt.cfg)
			before := e.seed(t, "app1", tt.from)
			tt.setup(t, e)
			e.rt.ResetCalls()
			_, err := e.m.Wake(context.Background(), "app1")
			if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			wantCalls(t, e.rt, tt.wantCalls)
			rec, gerr := e.m.Get("app1")
			if gerr != nil {
				t.Fatal(gerr)
			}
			evs := e.history(t, "app1")
			if tt.wantReason == "" {
				if rec.State != tt.from || rec.Reason != before.Reason || rec.Error != "" || len(evs) != 1 {
					t.Fatalf("transient failure changed the record to %s (%q, %q) with %d events", rec.State, rec.Reason, rec.Error, len(evs))
				}
				return
			}
			if rec.State != lifecycle.Error || rec.Reason != tt.wantReason || rec.Error == "" {
				t.Fatalf("state %s reason %q error %q; want error, %q and a message", rec.State, rec.Reason, rec.Error, tt.wantReason)
			}
			if len(evs) != 2 || evs[1].From != tt.from || evs[1].To != lifecycle.Error {
				t.Fatalf("events = %+v", evs)
			}
			if res, reserved := e.m.Resident(); res != 0 || reserved != 0 {
				t.Fatalf("resident, reserved = %d, %d; want 0, 0", res, reserved)
			}
		})
	}
}

func TestWakeSingleflight(t *testing.T) {
	const callers = 100
	e := newTestEnv(t, lifecycle.Config{})
	e.seed(t, "app1", lifecycle.Stopped)
	var reports atomic.Int32
	e.hooks.onWake(func(lifecycle.WakeResult) { reports.Add(1) })
	g := e.rt.Hold(t, "Start", "")

	type result struct {
		rec lifecycle.Record
		err error
	}
	results := make(chan result, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			rec, err := e.m.Wake(context.Background(), "app1")
			results <- result{rec, err}
		})
	}
	receive(t, g.Entered, "the first start")
	g.Release()
	wg.Wait()
	close(results)
	for r := range results {
		if r.err != nil || r.rec.State != lifecycle.Running {
			t.Fatalf("wake = %s, %v; want running", r.rec.State, r.err)
		}
	}
	if n := e.rt.Count("Start"); n != 1 {
		t.Fatalf("%d starts, want 1", n)
	}
	if n := reports.Load(); n != 1 {
		t.Fatalf("%d wake reports, want 1", n)
	}
	if n := len(e.history(t, "app1")); n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
}

func TestWakeCallerGivesUp(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	e.seed(t, "app1", lifecycle.Stopped)
	g := e.rt.Hold(t, "Start", "")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.m.Wake(ctx, "app1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	receive(t, g.Entered, "the start")
	if _, ok := e.m.Waking("app1"); !ok {
		t.Fatal("Waking = false while the start is held")
	}
	g.Release()
	waitFor(t, "the sandbox to run", func() bool { return e.state(t, "app1") == lifecycle.Running })
	waitFor(t, "the wake to end", func() bool { _, ok := e.m.Waking("app1"); return !ok })
	if n := e.rt.Count("Start"); n != 1 {
		t.Fatalf("%d starts, want 1", n)
	}
}

func TestAdmission(t *testing.T) {
	tests := []struct {
		name      string
		others    []lifecycle.State // states of the other sandboxes
		busy      bool              // the others have open connections
		target    lifecycle.State
		wantErr   error
		wantCalls map[string]int
		evicted   string // the other sandbox that must have been stopped
	}{
		{"stopped at capacity, others busy", []lifecycle.State{lifecycle.Running, lifecycle.Running}, true, lifecycle.Stopped, lifecycle.ErrCapacity, nil, ""},
		{"stopped at capacity, paused one busy", []lifecycle.State{lifecycle.Running, lifecycle.Paused}, true, lifecycle.Stopped, lifecycle.ErrCapacity, nil, ""},
		{"killed at capacity, others busy", []lifecycle.State{lifecycle.Running, lifecycle.Running}, true, lifecycle.Killed, lifecycle.ErrCapacity, nil, ""},
		{"stopped at capacity evicts the least recently active", []lifecycle.State{lifecycle.Running, lifecycle.Running}, false, lifecycle.Stopped, nil, map[string]int{"Stop": 1, "Start": 1}, "other0"},
		{"paused evicted before running", []lifecycle.State{lifecycle.Running, lifecycle.Paused}, false, lifecycle.Stopped, nil, map[string]int{"Stop": 1, "Start": 1}, "other1"},
		{"paused at capacity", []lifecycle.State{lifecycle.Running}, false, lifecycle.Paused, nil, map[string]int{"Unpause": 1}, ""},
		{"stopped below capacity", []lifecycle.State{lifecycle.Running, lifecycle.Stopped}, false, lifecycle.Stopped, nil, map[string]int{"Start": 1}, ""},
		{"running at capacity", []lifecycle.State{lifecycle.Running}, false, lifecycle.Running, nil, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{MaxResident: 2})
			for i, s := range tt.others {
				id := fmt.Sprintf("other%d", i)
				e.seed(t, id, s)
				if tt.busy {
					e.m.Activity(id).Open()
				}
			}
			// other1 was active more recently than other0.
			e.m.Activity("other1").Touch()
			e.seed(t, "app1", tt.target)
			resBefore, _ := e.m.Resident()
			_, err := e.m.Wake(context.Background(), "app1")
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			wantCalls(t, e.rt, tt.wantCalls)
			res, reserved := e.m.Resident()
			if reserved != 0 {
				t.Fatalf("%d reservations left", reserved)
			}
			if tt.wantErr != nil {
				if got := e.state(t, "app1"); got != tt.target || len(e.history(t, "app1")) != 1 {
					t.Fatalf("refused wake changed the sandbox to %s", got)
				}
				if res != resBefore {
					t.Fatalf("resident = %d, want %d", res, resBefore)
				}
				return
			}
			if got := e.state(t, "app1"); got != lifecycle.Running {
				t.Fatalf("state = %s, want running", got)
			}
			if res > 2 {
				t.Fatalf("resident = %d, above max_resident 2", res)
			}
			if tt.evicted != "" {
				if got := e.state(t, tt.evicted); got != lifecycle.Stopped {
					t.Fatalf("%s is %s, want stopped (evicted)", tt.evicted, got)
				}
			}
		})
	}

	t.Run("create at capacity", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{MaxResident: 1})
		e.seed(t, "other", lifecycle.Running)
		e.m.Activity("other").Open()
		_, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app1", Spec: testSpec()})
		if !errors.Is(err, lifecycle.ErrCapacity) {
			t.Fatalf("err = %v, want ErrCapacity", err)
		}
		if _, err := e.m.Get("app1"); !errors.Is(err, lifecycle.ErrNotFound) {
			t.Fatalf("refused create stored a record: %v", err)
		}
		wantCalls(t, e.rt, nil)
	})
}

// TestAdmissionReservesWakesInFlight: a wake in flight holds its admission, so
// a second wake cannot take the same room.
func TestAdmissionReservesWakesInFlight(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{MaxResident: 1})
	e.seed(t, "a", lifecycle.Stopped)
	e.seed(t, "b", lifecycle.Stopped)
	g := e.rt.Hold(t, "Start", "a")
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Wake(context.Background(), "a")
		done <- err
	}()
	receive(t, g.Entered, "the start of a")
	if res, reserved := e.m.Resident(); res != 0 || reserved != 1 {
		t.Fatalf("resident, reserved = %d, %d; want 0, 1", res, reserved)
	}
	if _, err := e.m.Wake(context.Background(), "b"); !errors.Is(err, lifecycle.ErrCapacity) {
		t.Fatalf("wake b: err = %v, want ErrCapacity", err)
	}
	g.Release()
	if err := receive(t, done, "the wake of a"); err != nil {
		t.Fatal(err)
	}
	if n := e.rt.Count("Start"); n != 1 {
		t.Fatalf("%d starts, want 1 (only a)", n)
	}
	if res, reserved := e.m.Resident(); res != 1 || reserved != 0 {
		t.Fatalf("resident, reserved = %d, %d; want 1, 0", res, reserved)
	}
	if got := e.state(t, "b"); got != lifecycle.Stopped {
		t.Fatalf("b is %s, want stopped", got)
	}
}

func TestPauseStop(t *testing.T) {
	type op struct {
		name   string
		call   func(m *lifecycle.Manager, id string) (lifecycle.Record, error)
		method string // runtime method called
		target lifecycle.State
		from   []lifecycle.State // states it acts from
	}
	ops := []op{
		{"pause", func(m *lifecycle.Manager, id string) (lifecycle.Record, error) {
			return m.Pause(context.Background(), id, "api")
		}, "Pause", lifecycle.Paused, []lifecycle.State{lifecycle.Running}},
		{"stop", func(m *lifecycle.Manager, id string) (lifecycle.Record, error) {
			return m.Stop(context.Background(), id, "api")
		}, "Stop", lifecycle.Stopped, []lifecycle.State{lifecycle.Running, lifecycle.Paused}},
	}
	for _, o := range ops {
		for _, from := range lifecycle.States {
			t.Run(fmt.Sprintf("%s_from_%s", o.name, from), func(t *testing.T) {
				e := newTestEnv(t, lifecycle.Config{})
				e.seed(t, "app1", from)
				rec, err := o.call(e.m, "app1")
				evs := e.history(t, "app1")
				switch {
				case from == o.target:
					if err != nil || rec.State != o.target {
						t.Fatalf("idempotent %s: %s, %v", o.name, rec.State, err)
					}
					wantCalls(t, e.rt, nil)
					if len(evs) != 1 {
						t.Fatalf("idempotent %s appended %d events", o.name, len(evs)-1)
					}
				case slices.Contains(o.from, from):
					if err != nil || rec.State != o.target || rec.Reason != "api" {
						t.Fatalf("%s: %+v, %v", o.name, rec, err)
					}
					wantCalls(t, e.rt, map[string]int{o.method: 1})
					if len(evs) != 2 || evs[1].From != from || evs[1].To != o.target {
						t.Fatalf("events = %+v", evs)
					}
				default:
					if !errors.Is(err, lifecycle.ErrConflict) {
						t.Fatalf("err = %v, want ErrConflict", err)
					}
					wantCalls(t, e.rt, nil)
					if got := e.state(t, "app1"); got != from || len(evs) != 1 {
						t.Fatalf("refused %s changed state to %s with %d events", o.name, got, len(evs))
					}
				}
			})
		}
		t.Run(o.name+"_unknown", func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			if _, err := o.call(e.m, "nosuch"); !errors.Is(err, lifecycle.ErrNotFound) {
				t.Fatalf("err = %v, want ErrNotFound", err)
			}
			wantCalls(t, e.rt, nil)
		})
		t.Run(o.name+"_engine_unavailable", func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			e.seed(t, "app1", lifecycle.Running)
			e.rt.FailWith(o.method, fmt.Errorf("docker: %w", lifecycle.ErrUnavailable))
			if _, err := o.call(e.m, "app1"); !errors.Is(err, lifecycle.ErrUnavailable) {
				t.Fatalf("err = %v, want ErrUnavailable", err)
			}
			if got := e.state(t, "app1"); got != lifecycle.Running || len(e.history(t, "app1")) != 1 {
				t.Fatalf("failed %s changed the state to %s", o.name, got)
			}
		})
	}

	t.Run("stop without a container", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		e.rt.Put("app1", "")
		rec, err := e.m.Stop(context.Background(), "app1", "api")
		if err != nil || rec.State != lifecycle.Stopped || !rec.StoppedAt.Equal(testClock) {
			t.Fatalf("stop = %+v, %v", rec, err)
		}
	})
	t.Run("resident count follows", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		if _, err := e.m.Pause(context.Background(), "app1", "idle"); err != nil {
			t.Fatal(err)
		}
		if res, _ := e.m.Resident(); res != 1 {
			t.Fatalf("resident after pause = %d, want 1", res)
		}
		if _, err := e.m.Stop(context.Background(), "app1", "idle"); err != nil {
			t.Fatal(err)
		}
		if res, _ := e.m.Resident(); res != 0 {
			t.Fatalf("resident after stop = %d, want 0", res)
		}
	})
}

func TestKeepalive(t *testing.T) {
	now := testClock.Add(time.Hour)
	tests := []struct {
		name    string
		id      string
		d       time.Duration
		want    time.Time
		wantErr error
	}{
		{"short", "app1", 10 * time.Minute, now.Add(10 * time.Minute), nil},
		{"at the cap", "app1", 2 * time.Hour, now.Add(2 * time.Hour), nil},
		{"capped", "app1", 48 * time.Hour, now.Add(2 * time.Hour), nil},
		{"zero", "app1", 0, time.Time{}, lifecycle.ErrInvalid},
		{"negative", "app1", -time.Second, time.Time{}, lifecycle.ErrInvalid},
		{"unknown", "nosuch", time.Minute, time.Time{}, lifecycle.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{KeepaliveMax: 2 * time.Hour, Now: func() time.Time { return now }})
			e.seed(t, "app1", lifecycle.Stopped)
			rec, err := e.m.Keepalive(tt.id, tt.d)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			wantCalls(t, e.rt, nil)
			if n := len(e.history(t, "app1")); n != 1 {
				t.Fatalf("keepalive appended %d events", n-1)
			}
			stored, _ := e.m.Get("app1")
			if tt.wantErr != nil {
				if !stored.KeepaliveUntil.IsZero() || !stored.LastActiveAt.Equal(testClock) {
					t.Fatalf("refused keepalive changed the record: %+v", stored)
				}
				return
			}
			for _, r := range []lifecycle.Record{rec, stored} {
				if !r.KeepaliveUntil.Equal(tt.want) || !r.LastActiveAt.Equal(now) || r.State != lifecycle.Stopped {
					t.Fatalf("keepalive until %v, last active %v, state %s; want %v, %v, stopped", r.KeepaliveUntil, r.LastActiveAt, r.State, tt.want, now)
				}
			}
		})
	}
}

// TestUpdateAccessRotatesTokens: a change of access revokes every preview
// token (moves the generation); other changes, and setting the access it
// already has, do not.
func TestUpdateAccessRotatesTokens(t *testing.T) {
	str := func(s string) *string { return &s }
	idle := time.Minute
	tests := []struct {
		name    string
		stored  string // Spec.Access as stored ("" for records made before access levels)
		patch   lifecycle.Patch
		wantGen uint64
		want    string
	}{
		{"public to private", lifecycle.AccessPublic, lifecycle.Patch{Access: str(lifecycle.AccessPrivate)}, 6, lifecycle.AccessPrivate},
		{"private to public", lifecycle.AccessPrivate, lifecycle.Patch{Access: str(lifecycle.AccessPublic)}, 6, lifecycle.AccessPublic},
		{"private again", lifecycle.AccessPrivate, lifecycle.Patch{Access: str(lifecycle.AccessPrivate)}, 5, lifecycle.AccessPrivate},
		{"public again", lifecycle.AccessPublic, lifecycle.Patch{Access: str(lifecycle.AccessPublic)}, 5, lifecycle.AccessPublic},
		{"unset is public", "", lifecycle.Patch{Access: str(lifecycle.AccessPublic)}, 5, lifecycle.AccessPublic},
		{"unset to private", "", lifecycle.Patch{Access: str(lifecycle.AccessPrivate)}, 6, lifecycle.AccessPrivate},
		{"no access in the patch", lifecycle.AccessPrivate, lifecycle.Patch{IdlePause: &idle}, 5, lifecycle.AccessPrivate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			e.seedWith(t, "app1", lifecycle.Stopped, func(r *lifecycle.Record) {
				r.Spec.Access = tt.stored
				r.TokenGeneration = 5
			})
			rec, err := e.m.Update("app1", tt.patch)
			if err != nil {
				t.Fatal(err)
			}
			stored, _ := e.m.Get("app1")
			for _, r := range []lifecycle.Record{rec, stored} {
				if r.TokenGeneration != tt.wantGen || r.Spec.Access != tt.want {
					t.Fatalf("generation %d, access %q; want %d, %q", r.TokenGeneration, r.Spec.Access, tt.wantGen, tt.want)
				}
			}
		})
	}
}

func TestDestroy(t *testing.T) {
	t.Run("running", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		if err := e.m.Destroy(context.Background(), "app1", "api"); err != nil {
			t.Fatal(err)
		}
		wantCalls(t, e.rt, map[string]int{"Remove": 1})
		if _, err := e.m.Get("app1"); !errors.Is(err, lifecycle.ErrNotFound) {
			t.Fatalf("Get after destroy: %v", err)
		}
		if e.rt.ContainerState("app1") != "" || !e.rt.HasVolume("app1") {
			t.Fatal("destroy must remove the container and keep the volume")
		}
		evs := e.history(t, "app1")
		if last := evs[len(evs)-1]; last.Type != lifecycle.EventDestroyed || last.From != lifecycle.Running || last.Reason != "api" {
			t.Fatalf("last event = %+v", last)
		}
		if res, _ := e.m.Resident(); res != 0 {
			t.Fatalf("resident = %d, want 0", res)
		}
		if _, err := e.m.Wake(context.Background(), "app1"); !errors.Is(err, lifecycle.ErrNotFound) {
			t.Fatalf("wake after destroy: %v, want ErrNotFound", err)
		}
	})
	t.Run("unknown", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{})
		if err := e.m.Destroy(context.Background(), "nosuch", "api"); !errors.Is(err, lifecycle.ErrNotFound) {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
		wantCalls(t, e.rt, nil)
	})
	t.Run("engine unavailable", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		e.rt.FailWith("Remove", fmt.Errorf("docker: %w", lifecycle.ErrUnavailable))
		if err := e.m.Destroy(context.Background(), "app1", "api"); !errors.Is(err, lifecycle.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
		if got := e.state(t, "app1"); got != lifecycle.Running {
			t.Fatalf("state = %s, want running", got)
		}
		if res, _ := e.m.Resident(); res != 1 {
			t.Fatalf("resident = %d, want 1", res)
		}
	})
}

func TestPurge(t *testing.T) {
	tests := []struct {
		name      string
		id        string
		setup     func(t *testing.T, e *testEnv)
		wantErr   error
		wantFreed int64
		wantFrom  lifecycle.State
	}{
		{name: "unknown, no volume", id: "nosuch", wantErr: lifecycle.ErrNotFound},
		{name: "invalid id", id: "No-Such", wantErr: lifecycle.ErrNotFound},
		{
			name:      "stopped",
			id:        "app1",
			setup:     func(t *testing.T, e *testEnv) { e.seed(t, "app1", lifecycle.Stopped) },
			wantFreed: lifecycletest.VolumeBytes,
			wantFrom:  lifecycle.Stopped,
		},
		{
			name:      "running",
			id:        "app1",
			setup:     func(t *testing.T, e *testEnv) { e.seed(t, "app1", lifecycle.Running) },
			wantFreed: lifecycletest.VolumeBytes,
			wantFrom:  lifecycle.Running,
		},
		{
			name: "record without a volume",
			id:   "app1",
			setup: func(t *testing.T, e *testEnv) {
				e.seed(t, "app1", lifecycle.Killed)
				if _, err := e.rt.RemoveVolume(context.Background(), "app1"); err != nil {
					t.Fatal(err)
				}
			},
			wantFrom: lifecycle.Killed,
		},
		{
			name: "after destroy",
			id:   "app1",
			setup: func(t *testing.T, e *testEnv) {
				e.seed(t, "app1", lifecycle.Running)
				if err := e.m.Destroy(context.Background(), "app1", "api"); err != nil {
					t.Fatal(err)
				}
			},
			wantFreed: lifecycletest.VolumeBytes,
		},
		{
			name: "volume removal unavailable",
			id:   "app1",
			setup: func(t *testing.T, e *testEnv) {
				e.seed(t, "app1", lifecycle.Stopped)
				e.rt.FailWith("RemoveVolume", fmt.Errorf("docker: %w", lifecycle.ErrUnavailable))
			},
			wantErr: lifecycle.ErrUnavailable,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			if tt.setup != nil {
				tt.setup(t, e)
			}
			evsBefore := len(e.history(t, tt.id))
			stateBefore := e.state(t, tt.id)
			freed, err := e.m.Purge(context.Background(), tt.id, "api")
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			evs := e.history(t, tt.id)
			if tt.wantErr != nil {
				if len(evs) != evsBefore || e.state(t, tt.id) != stateBefore {
					t.Fatalf("failed purge changed the sandbox: %d → %d events, state %s → %s", evsBefore, len(evs), stateBefore, e.state(t, tt.id))
				}
				return
			}
			if freed != tt.wantFreed {
				t.Fatalf("freed %d bytes, want %d", freed, tt.wantFreed)
			}
			if _, err := e.m.Get(tt.id); !errors.Is(err, lifecycle.ErrNotFound) {
				t.Fatalf("record still there: %v", err)
			}
			if e.rt.HasVolume(tt.id) || e.rt.ContainerState(tt.id) != "" {
				t.Fatal("purge left the volume or the container")
			}
			if len(evs) != evsBefore+1 {
				t.Fatalf("purge appended %d events, want 1", len(evs)-evsBefore)
			}
			if last := evs[len(evs)-1]; last.Type != lifecycle.EventPurged || last.From != tt.wantFrom || last.Reason != "api" || last.SandboxID != tt.id {
				t.Fatalf("last event = %+v", last)
			}
			if res, _ := e.m.Resident(); res != 0 {
				t.Fatalf("resident = %d, want 0", res)
			}
			// Everything is gone now.
			if _, err := e.m.Purge(context.Background(), tt.id, "api"); !errors.Is(err, lifecycle.ErrNotFound) {
				t.Fatalf("second purge: %v, want ErrNotFound", err)
			}
		})
	}
}

func TestList(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	e.seed(t, "a", lifecycle.Running)
	e.seed(t, "b", lifecycle.Stopped)
	e.seed(t, "c", lifecycle.Running)
	tests := []struct {
		state   lifecycle.State
		want    []string
		wantErr error
	}{
		{"", []string{"a", "b", "c"}, nil},
		{lifecycle.Running, []string{"a", "c"}, nil},
		{lifecycle.Paused, nil, nil},
		{"asleep", nil, lifecycle.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(string(tt.state), func(t *testing.T) {
			recs, err := e.m.List(tt.state)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			var ids []string
			for _, r := range recs {
				ids = append(ids, r.ID)
			}
			if !slices.Equal(ids, tt.want) {
				t.Fatalf("ids = %v, want %v", ids, tt.want)
			}
		})
	}
}

// TestNewManagerCountsResident: the resident count survives a restart.
func TestNewManagerCountsResident(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	for i, s := range lifecycle.States {
		e.seed(t, fmt.Sprintf("s%d", i), s)
	}
	m, err := lifecycle.NewManager(e.st, e.rt, lifecycle.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if res, reserved := m.Resident(); res != 2 || reserved != 0 {
		t.Fatalf("resident, reserved = %d, %d; want 2, 0", res, reserved)
	}
}

func TestCloseWaitsForWake(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	e.seed(t, "app1", lifecycle.Stopped)
	e.seed(t, "app2", lifecycle.Stopped)
	sub := e.m.Subscribe()
	g := e.rt.Hold(t, "Start", "app1")
	wakeDone := make(chan error, 1)
	go func() {
		_, err := e.m.Wake(context.Background(), "app1")
		wakeDone <- err
	}()
	receive(t, g.Entered, "the start")

	closed := make(chan struct{})
	go func() {
		e.m.Close()
		close(closed)
	}()
	// Once Close has begun, new work is refused; an invalid create is
	// refused without side effects either way, so it probes for that.
	waitFor(t, "close to begin", func() bool {
		_, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "-"})
		return errors.Is(err, lifecycle.ErrClosed)
	})
	select {
	case <-closed:
		t.Fatal("Close returned while a wake was in flight")
	default:
	}
	g.Release()
	receive(t, closed, "Close")
	if _, ok := e.m.Waking("app1"); ok {
		t.Fatal("a wake is still in flight after Close")
	}
	receive(t, wakeDone, "the wake")

	for _, id := range []string{"app1", "app2"} {
		if _, err := e.m.Wake(context.Background(), id); !errors.Is(err, lifecycle.ErrClosed) {
			t.Fatalf("wake %s after close: %v, want ErrClosed", id, err)
		}
	}
	if _, err := e.m.Create(context.Background(), lifecycle.CreateRequest{ID: "app3", Spec: testSpec()}); !errors.Is(err, lifecycle.ErrClosed) {
		t.Fatalf("create after close: %v, want ErrClosed", err)
	}
	if n := e.rt.Count("Start"); n != 1 {
		t.Fatalf("%d starts, want 1", n)
	}
	for range sub.C {
	}
	if sub.Lagged() {
		t.Fatal("subscription closed by Close reports Lagged")
	}
	if err := e.m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
