package lifecycle_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sandwake/sandwake/lifecycle"
)

// A wake asked for while the sandbox's lock is held (here by a stop) is in
// flight from the moment it was asked for: Waking says so at once, and
// JoinWake rides on it instead of reporting nothing to join.
func TestWakeIsInFlightFromTheAsking(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	e.seed(t, "app1", lifecycle.Running)
	e.seed(t, "idle1", lifecycle.Stopped)
	g := e.rt.Hold(t, "Stop", "app1")
	stopped := make(chan error, 1)
	go func() {
		_, err := e.m.Stop(context.Background(), "app1", "test")
		stopped <- err
	}()
	receive(t, g.Entered, "the stop")

	e.m.StartWake(context.Background(), "app1")
	if _, ok := e.m.Waking("app1"); !ok {
		t.Fatal("Waking = false right after StartWake")
	}
	// The wake waits behind the stop's lock: JoinWake joins it (ok), and
	// with a context already cancelled returns at once instead of waiting.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok, err := e.m.JoinWake(cancelled, "app1"); !ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("JoinWake during the wake = %v, %v; want true (joined) and the cancelled context", ok, err)
	}
	g.Release()
	if err := receive(t, stopped, "the stop"); err != nil {
		t.Fatalf("stop: %v", err)
	}
	waitFor(t, "the wake to end", func() bool { _, ok := e.m.Waking("app1"); return !ok })
	if st := e.state(t, "app1"); st != lifecycle.Running {
		t.Fatalf("after the wake app1 is %s, want running", st)
	}

	// Nothing in flight: JoinWake starts nothing.
	before := e.rt.Count("Start")
	if _, ok, err := e.m.JoinWake(context.Background(), "idle1"); ok || err != nil {
		t.Fatalf("JoinWake with no wake in flight = %v, %v; want false, nil", ok, err)
	}
	if n := e.rt.Count("Start"); n != before {
		t.Fatalf("JoinWake started a wake: %d starts, want %d", n, before)
	}
	if s := e.state(t, "idle1"); s != lifecycle.Stopped {
		t.Fatalf("idle1 is %s, want stopped", s)
	}
}
