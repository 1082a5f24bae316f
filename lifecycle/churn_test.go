package lifecycle_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// TestEvictionMinResident: admission does not evict a sandbox active within
// min_resident; it refuses with a readable message, and evicts the least
// recently active once its min_resident has passed.
func TestEvictionMinResident(t *testing.T) {
	e, clock := newClockEnv(t, lifecycle.Config{MaxResident: 2, MinResident: 30 * time.Second})
	log := (&eventLog{}).watch(e)
	e.seedWith(t, "older", lifecycle.Running, func(r *lifecycle.Record) { r.LastActiveAt = testClock.Add(10 * time.Second) })
	e.seedWith(t, "newer", lifecycle.Running, func(r *lifecycle.Record) { r.LastActiveAt = testClock.Add(25 * time.Second) })
	e.seed(t, "asleep", lifecycle.Stopped)

	clock.at(30 * time.Second)
	_, err := e.m.Wake(context.Background(), "asleep")
	if !errors.Is(err, lifecycle.ErrCapacity) {
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
		e := newTestEnv(t, lifecycle.Config{MaxResident: 1, MinResident: time.Hour, CapacityWait: time.Minute})
		e.seed(t, "busy", lifecycle.Running)
		e.seed(t, "asleep", lifecycle.Stopped)
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
		if s := e.state(t, "asleep"); s != lifecycle.Running {
			t.Fatalf("state %s, want running", s)
		}
	})
	t.Run("no room in time", func(t *testing.T) {
		e := newTestEnv(t, lifecycle.Config{MaxResident: 1, MinResident: time.Hour, CapacityWait: 50 * time.Millisecond})
		e.seed(t, "busy", lifecycle.Running)
		e.seed(t, "asleep", lifecycle.Stopped)
		_, err := e.m.Wake(context.Background(), "asleep")
		if !errors.Is(err, lifecycle.ErrCapacity) || !strings.Contains(err.Error(), "waited 50ms for room") {
			t.Fatalf("err = %v, want ErrCapacity after waiting 50ms", err)
		}
		if s := e.state(t, "busy"); s != lifecycle.Running {
			t.Fatalf("busy is %s, want running", s)
		}
	})
}
