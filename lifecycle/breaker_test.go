package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

var errDaemonDown = fmt.Errorf("docker: %w", lifecycle.ErrUnavailable)

// wantBreaker checks whether the breaker is open.
func wantBreaker(t *testing.T, m *lifecycle.Manager, open bool) {
	t.Helper()
	if got, until := m.BreakerOpen(); got != open {
		t.Fatalf("breaker open = %v (until %v), want %v", got, until, open)
	}
}

// stopFails stops app1 through the manager and wants ErrUnavailable.
func stopFails(t *testing.T, e *testEnv) error {
	t.Helper()
	_, err := e.m.Stop(context.Background(), "app1", "api")
	if !errors.Is(err, lifecycle.ErrUnavailable) {
		t.Fatalf("stop: err = %v, want ErrUnavailable", err)
	}
	return err
}

// openBreaker makes the engine fail Stop and opens the breaker with
// lifecycle.BreakerThreshold failed stops of app1.
func openBreaker(t *testing.T, e *testEnv) {
	t.Helper()
	e.rt.FailWith("Stop", errDaemonDown)
	for range lifecycle.BreakerThreshold {
		stopFails(t, e)
	}
	wantBreaker(t, e.m, true)
}

func TestBreaker(t *testing.T) {
	t.Run("opens after consecutive failures", func(t *testing.T) {
		e, clock := newClockEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		e.seed(t, "app2", lifecycle.Stopped)
		wantBreaker(t, e.m, false)
		e.rt.FailWith("Stop", errDaemonDown)
		for i := range lifecycle.BreakerThreshold {
			wantBreaker(t, e.m, false)
			stopFails(t, e)
			if n := e.rt.Count("Stop"); n != i+1 {
				t.Fatalf("%d stop calls, want %d", n, i+1)
			}
		}
		open, until := e.m.BreakerOpen()
		if !open || !until.Equal(testClock.Add(lifecycle.BreakerCooldown)) {
			t.Fatalf("breaker open = %v until %v, want until %v", open, until, testClock.Add(lifecycle.BreakerCooldown))
		}

		// Open: every engine call fails fast, without reaching the engine.
		err := stopFails(t, e)
		if !strings.Contains(err.Error(), "circuit open") {
			t.Fatalf("fail-fast error %q does not say why", err)
		}
		if _, err := e.m.Wake(context.Background(), "app2"); !errors.Is(err, lifecycle.ErrUnavailable) {
			t.Fatalf("wake: err = %v, want ErrUnavailable", err)
		}
		if _, err := e.m.Reconcile(context.Background()); !errors.Is(err, lifecycle.ErrUnavailable) {
			t.Fatalf("reconcile: err = %v, want ErrUnavailable", err)
		}
		if _, err := e.m.ReconcileOne(context.Background(), "app1"); !errors.Is(err, lifecycle.ErrUnavailable) {
			t.Fatalf("reconcile one: err = %v, want ErrUnavailable", err)
		}
		wantCalls(t, e.rt, map[string]int{"Stop": lifecycle.BreakerThreshold})
		// A transient failure leaves the records as they were.
		if s1, s2 := e.state(t, "app1"), e.state(t, "app2"); s1 != lifecycle.Running || s2 != lifecycle.Stopped {
			t.Fatalf("states %s, %s after failing fast", s1, s2)
		}

		clock.at(lifecycle.BreakerCooldown - time.Nanosecond)
		wantBreaker(t, e.m, true)
		stopFails(t, e)
		if n := e.rt.Count("Stop"); n != lifecycle.BreakerThreshold {
			t.Fatalf("%d stop calls just before the cooldown ends, want %d", n, lifecycle.BreakerThreshold)
		}

		// After the cooldown, calls reach the engine again.
		clock.at(lifecycle.BreakerCooldown)
		wantBreaker(t, e.m, false)
		stopFails(t, e)
		if n := e.rt.Count("Stop"); n != lifecycle.BreakerThreshold+1 {
			t.Fatalf("%d stop calls after the cooldown, want %d", n, lifecycle.BreakerThreshold+1)
		}
		e.rt.FailWith("Stop", nil)
		if _, err := e.m.Stop(context.Background(), "app1", "api"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.m.Wake(context.Background(), "app2"); err != nil {
			t.Fatal(err)
		}
		wantBreaker(t, e.m, false)
	})

	t.Run("reopens after another run of failures", func(t *testing.T) {
		e, clock := newClockEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		openBreaker(t, e)
		clock.at(lifecycle.BreakerCooldown)
		// The count starts over: one failure does not reopen it.
		for i := range lifecycle.BreakerThreshold {
			wantBreaker(t, e.m, false)
			stopFails(t, e)
			if n := e.rt.Count("Stop"); n != lifecycle.BreakerThreshold+i+1 {
				t.Fatalf("%d stop calls, want %d", n, lifecycle.BreakerThreshold+i+1)
			}
		}
		open, until := e.m.BreakerOpen()
		if !open || !until.Equal(testClock.Add(2*lifecycle.BreakerCooldown)) {
			t.Fatalf("breaker open = %v until %v", open, until)
		}
	})

	t.Run("ping closes it", func(t *testing.T) {
		e, _ := newClockEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		openBreaker(t, e)
		// A failing ping reaches the engine and leaves it open.
		e.rt.FailWith("Ping", errDaemonDown)
		if err := e.m.Ping(context.Background()); !errors.Is(err, lifecycle.ErrUnavailable) {
			t.Fatalf("ping: err = %v, want ErrUnavailable", err)
		}
		wantBreaker(t, e.m, true)
		e.rt.FailWith("Ping", nil)
		if err := e.m.Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := e.rt.Count("Ping"); n != 2 {
			t.Fatalf("%d ping calls, want 2: ping is never failed fast", n)
		}
		wantBreaker(t, e.m, false)
		e.rt.FailWith("Stop", nil)
		if _, err := e.m.Stop(context.Background(), "app1", "api"); err != nil {
			t.Fatal(err)
		}
		if n := e.rt.Count("Stop"); n != lifecycle.BreakerThreshold+1 {
			t.Fatalf("%d stop calls, want %d", n, lifecycle.BreakerThreshold+1)
		}
	})

	t.Run("ping also resets the count", func(t *testing.T) {
		e, _ := newClockEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		e.rt.FailWith("Stop", errDaemonDown)
		for range lifecycle.BreakerThreshold - 1 {
			stopFails(t, e)
		}
		if err := e.m.Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
		stopFails(t, e)
		wantBreaker(t, e.m, false)
	})
}

// TestBreakerCountsOnlyConsecutiveTransientFailures: any answer from the
// engine (success, not found, a refusal) starts the count over, and calls
// cancelled by their caller never open it.
func TestBreakerCountsOnlyConsecutiveTransientFailures(t *testing.T) {
	tests := []struct {
		name  string
		reset func(t *testing.T, e *testEnv) // one engine answer that is not a transient failure
	}{
		{"success", func(t *testing.T, e *testEnv) {
			if _, err := e.m.ReconcileOne(context.Background(), "app1"); err != nil {
				t.Fatal(err)
			}
		}},
		{"container not found", func(t *testing.T, e *testEnv) {
			if _, err := e.m.GuardedRuntime().Inspect(context.Background(), "nosuch"); !errors.Is(err, lifecycle.ErrContainerNotFound) {
				t.Fatalf("inspect: err = %v, want ErrContainerNotFound", err)
			}
		}},
		{"refusal", func(t *testing.T, e *testEnv) {
			e.rt.FailWith("Pause", errors.New("container is restarting"))
			if _, err := e.m.Pause(context.Background(), "app1", "api"); err == nil || errors.Is(err, lifecycle.ErrUnavailable) {
				t.Fatalf("pause: err = %v, want a refusal", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, _ := newClockEnv(t, lifecycle.Config{})
			e.seed(t, "app1", lifecycle.Running)
			e.rt.FailWith("Stop", errDaemonDown)
			for range lifecycle.BreakerThreshold - 1 {
				stopFails(t, e)
			}
			tt.reset(t, e)
			for range lifecycle.BreakerThreshold - 1 {
				stopFails(t, e)
			}
			wantBreaker(t, e.m, false)
			stopFails(t, e)
			wantBreaker(t, e.m, true)
		})
	}

	t.Run("cancelled calls never open it", func(t *testing.T) {
		e, _ := newClockEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Running)
		e.rt.FailWith("Pause", fmt.Errorf("%w: %w", lifecycle.ErrUnavailable, context.Canceled))
		for range 2 * lifecycle.BreakerThreshold {
			if _, err := e.m.Pause(context.Background(), "app1", "api"); !errors.Is(err, context.Canceled) {
				t.Fatalf("pause: err = %v, want context.Canceled", err)
			}
		}
		wantBreaker(t, e.m, false)
		if n := e.rt.Count("Pause"); n != 2*lifecycle.BreakerThreshold {
			t.Fatalf("%d pause calls, want %d", n, 2*lifecycle.BreakerThreshold)
		}
	})
}
