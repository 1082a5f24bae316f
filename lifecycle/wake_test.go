package lifecycle_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
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

// directRuntime dials sandboxes at their own addresses (upstream mode
// direct), where readiness is an accepted connection.
type directRuntime struct{ *lifecycletest.Runtime }

func (directRuntime) Direct() bool { return true }

// TestUnpauseSkipsTheConnectProbe: in direct mode without ready_path, a
// wake that unpauses the container sandwake paused does not probe (the app
// listened when paused); a wake that finds the container exited behind
// sandwake's back and starts it does, as a wake from stopped does. The
// wake's phases tell (a real clock: a probe takes some time, none takes
// none).
func TestUnpauseSkipsTheConnectProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var rt *lifecycletest.Runtime
	e := newTestEnvWith(t, lifecycle.Config{Now: time.Now}, func(f *lifecycletest.Runtime) lifecycle.Runtime {
		rt = f
		return directRuntime{f}
	})
	rt.SetUpstreams(map[int]string{lifecycle.TestPort: ln.Addr().String()})
	ctx := context.Background()
	if _, err := e.m.Create(ctx, lifecycle.CreateRequest{ID: "app1", Spec: lifecycle.SampleSpec()}); err != nil {
		t.Fatal(err)
	}
	wake := func(what string) lifecycle.WakePhases {
		t.Helper()
		if _, err := e.m.Wake(ctx, "app1"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		ph, ok := e.m.LastWake("app1")
		if !ok {
			t.Fatalf("%s: no phases", what)
		}
		return ph
	}
	if _, err := e.m.Pause(ctx, "app1", "api"); err != nil {
		t.Fatal(err)
	}
	if ph := wake("wake from paused"); ph.Ready != 0 {
		t.Fatalf("a wake from paused probed the app (%s)", ph.Ready)
	}
	// Paused, then exited behind sandwake's back: the wake starts it and
	// probes.
	if _, err := e.m.Pause(ctx, "app1", "api"); err != nil {
		t.Fatal(err)
	}
	rt.Put("app1", lifecycle.ContainerExited)
	if ph := wake("wake of an exited container recorded paused"); ph.Ready <= 0 {
		t.Fatal("a wake that started an exited container did not probe the app")
	}
	if _, err := e.m.Stop(ctx, "app1", "api"); err != nil {
		t.Fatal(err)
	}
	if ph := wake("wake from stopped"); ph.Ready <= 0 {
		t.Fatal("a wake from stopped did not probe the app")
	}
}
