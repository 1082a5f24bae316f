package lifecycle

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestActivityHandOff: a request registered with Enter and a pause or stop
// marked with beginDown exclude each other, and a route read before a pause
// or stop is refused after it.
func TestActivityHandOff(t *testing.T) {
	tests := []struct {
		name      string
		open      int  // exchanges open before
		force     bool // a forced beginDown (API, expiry)
		wantDown  bool // beginDown succeeds
		wantEnter bool // Enter during the down window succeeds
	}{
		{name: "idle: the stop goes first", open: 0, wantDown: true},
		{name: "in use: the stop backs off", open: 1, wantDown: false, wantEnter: true},
		{name: "in use, forced: the stop goes first", open: 2, force: true, wantDown: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &Activity{clock: time.Now}
			downs := a.Downs()
			for range tt.open {
				if !a.Enter(downs) {
					t.Fatal("Enter refused on an idle sandbox")
				}
			}
			if got := a.beginDown(tt.force); got != tt.wantDown {
				t.Fatalf("beginDown = %v, want %v", got, tt.wantDown)
			}
			if got := a.OpenConnections(); got != int64(tt.open) {
				t.Fatalf("open connections = %d, want %d", got, tt.open)
			}
			if got := a.Enter(downs); got != tt.wantEnter {
				t.Fatalf("Enter during the window = %v, want %v", got, tt.wantEnter)
			}
			if tt.wantDown {
				if !a.GoingDown() {
					t.Fatal("not going down")
				}
				a.endDown()
				if a.Enter(downs) {
					t.Fatal("Enter with the downs read before the stop succeeded after it")
				}
				if !a.Enter(a.Downs()) {
					t.Fatal("Enter with fresh downs refused after the stop ended")
				}
			}
		})
	}
}

// TestActivityHandOffRace: under the race detector, requests entering and
// finishing in a loop never overlap a successful beginDown.
func TestActivityHandOffRace(t *testing.T) {
	a := &Activity{clock: time.Now}
	var down atomic.Bool
	var overlaps, entered, downsDone atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if a.Enter(a.Downs()) {
					entered.Add(1)
					if down.Load() {
						overlaps.Add(1)
					}
					a.Finish()
				}
			}
		})
	}
	for downsDone.Load() < 2000 || entered.Load() < 2000 {
		if a.beginDown(false) {
			down.Store(true)
			downsDone.Add(1)
			down.Store(false)
			a.endDown()
		}
	}
	close(stop)
	wg.Wait()
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d requests entered while a stop was under way (%d entered, %d stops)", n, entered.Load(), downsDone.Load())
	}
	if a.OpenConnections() != 0 || a.GoingDown() {
		t.Fatalf("left open %d, going down %v", a.OpenConnections(), a.GoingDown())
	}
}

// TestEvictionMinResident: admission does not evict a sandbox active within
// min_resident; it refuses with a readable message, and evicts the least
// recently active once its min_resident has passed.
func TestEvictionMinResident(t *testing.T) {
	e, clock := newClockEnv(t, Config{MaxResident: 2, MinResident: 30 * time.Second})
	log := (&eventLog{}).watch(e)
	e.seedWith(t, "older", Running, func(r *Record) { r.LastActiveAt = testClock.Add(10 * time.Second) })
	e.seedWith(t, "newer", Running, func(r *Record) { r.LastActiveAt = testClock.Add(25 * time.Second) })
	e.seed(t, "asleep", Stopped)

	clock.at(30 * time.Second)
	_, err := e.m.Wake(context.Background(), "asleep")
	if !errors.Is(err, ErrCapacity) {
		t.Fatalf("wake with every resident sandbox recently active: err = %v, want ErrCapacity", err)
	}
	for _, want := range []string{"waking sandbox asleep: no capacity: all 2 places of max_resident are taken", "min_resident"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("message %q does not say %q", err, want)
		}
	}
	if got := log.stopped("evicted"); len(got) != 0 {
		t.Fatalf("stopped %v, want none", got)
	}

	clock.at(41 * time.Second) // "older" idle 31s, "newer" 16s
	if _, err := e.m.Wake(context.Background(), "asleep"); err != nil {
		t.Fatal(err)
	}
	if got := log.stopped("evicted"); len(got) != 1 || got[0] != "older" {
		t.Fatalf("evicted %v, want [older]", got)
	}
}

// TestAdmissionWaitsForRoom: when every resident sandbox is in use, a wake
// waits up to CapacityWait for room and takes it as soon as it is freed; with
// no room in that time it is refused.
func TestAdmissionWaitsForRoom(t *testing.T) {
	t.Run("room freed while waiting", func(t *testing.T) {
		e := newTestEnv(t, Config{MaxResident: 1, MinResident: time.Hour, CapacityWait: time.Minute})
		e.seed(t, "busy", Running)
		e.seed(t, "asleep", Stopped)
		errs := make(chan error, 1)
		go func() {
			_, err := e.m.Wake(context.Background(), "asleep")
			errs <- err
		}()
		waitFor(t, "the wake to wait for room", func() bool {
			_, ok := e.m.Waking("asleep")
			return ok
		})
		select {
		case err := <-errs:
			t.Fatalf("wake ended before room was freed: %v", err)
		default:
		}
		if _, err := e.m.Stop(context.Background(), "busy", "api"); err != nil {
			t.Fatal(err)
		}
		if err := receive(t, errs, "the wake"); err != nil {
			t.Fatal(err)
		}
		if s := e.state(t, "asleep"); s != Running {
			t.Fatalf("state %s, want running", s)
		}
	})
	t.Run("no room in time", func(t *testing.T) {
		e := newTestEnv(t, Config{MaxResident: 1, MinResident: time.Hour, CapacityWait: 50 * time.Millisecond})
		e.seed(t, "busy", Running)
		e.seed(t, "asleep", Stopped)
		_, err := e.m.Wake(context.Background(), "asleep")
		if !errors.Is(err, ErrCapacity) || !strings.Contains(err.Error(), "waited 50ms for room") {
			t.Fatalf("err = %v, want ErrCapacity after waiting 50ms", err)
		}
		if s := e.state(t, "busy"); s != Running {
			t.Fatalf("busy is %s, want running", s)
		}
	})
}
