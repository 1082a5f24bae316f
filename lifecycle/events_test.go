package lifecycle_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// drain reads sub.C until it is closed and returns what it read.
func drain(t *testing.T, sub *lifecycle.Subscription) []lifecycle.Event {
	t.Helper()
	var evs []lifecycle.Event
	for {
		ev, ok := receiveOK(t, sub.C)
		if !ok {
			return evs
		}
		evs = append(evs, ev)
	}
}

func receiveOK(t *testing.T, c <-chan lifecycle.Event) (lifecycle.Event, bool) {
	t.Helper()
	select {
	case ev, ok := <-c:
		return ev, ok
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for an event or the end of the subscription")
		return lifecycle.Event{}, false
	}
}

func checkConsecutive(t *testing.T, evs []lifecycle.Event) {
	t.Helper()
	for i := 1; i < len(evs); i++ {
		if evs[i].ID != evs[i-1].ID+1 {
			t.Fatalf("event %d has id %d after %d", i, evs[i].ID, evs[i-1].ID)
		}
	}
}

func TestSubscribe(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	sub := e.m.Subscribe()
	ctx := context.Background()
	steps := []struct {
		name string
		do   func() error
	}{
		{"create", func() error {
			_, err := e.m.Create(ctx, lifecycle.CreateRequest{ID: "app1", Spec: testSpec()})
			return err
		}},
		{"pause", func() error { _, err := e.m.Pause(ctx, "app1", "idle"); return err }},
		{"wake", func() error { _, err := e.m.Wake(ctx, "app1"); return err }},
		{"stop", func() error { _, err := e.m.Stop(ctx, "app1", "api"); return err }},
		{"keepalive (no event)", func() error { _, err := e.m.Keepalive("app1", 1); return err }},
		{"destroy", func() error { return e.m.Destroy(ctx, "app1", "api") }},
		{"purge", func() error { _, err := e.m.Purge(ctx, "app1", "api"); return err }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	sub.Cancel()
	evs := drain(t, sub)
	if sub.Lagged() {
		t.Fatal("cancelled subscription reports Lagged")
	}
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
		if ev.SandboxID != "app1" {
			t.Fatalf("event of %q", ev.SandboxID)
		}
	}
	want := []string{"sandbox.creating", "sandbox.running", "sandbox.paused", "sandbox.running", "sandbox.stopped", lifecycle.EventDestroyed, lifecycle.EventPurged}
	if !slices.Equal(types, want) {
		t.Fatalf("events = %v, want %v", types, want)
	}
	if evs[0].ID != 1 {
		t.Fatalf("first event id = %d, want 1", evs[0].ID)
	}
	checkConsecutive(t, evs)
	// The bus delivers what the log holds, in the same order.
	logged, err := e.st.EventsAfter(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(logged) != len(evs) {
		t.Fatalf("log has %d events, bus delivered %d", len(logged), len(evs))
	}
	for i := range logged {
		if logged[i].ID != evs[i].ID || logged[i].Type != evs[i].Type {
			t.Fatalf("event %d: log %+v, bus %+v", i, logged[i], evs[i])
		}
	}
	sub.Cancel() // a second cancel is harmless
}

// TestSubscribeConcurrentOrder: events of concurrent wakes arrive in id order.
func TestSubscribeConcurrentOrder(t *testing.T) {
	const n = 50
	e := newTestEnv(t, lifecycle.Config{})
	for i := range n {
		e.seed(t, fmt.Sprintf("s%d", i), lifecycle.Stopped)
	}
	sub := e.m.Subscribe()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := e.m.Wake(context.Background(), fmt.Sprintf("s%d", i))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	sub.Cancel()
	evs := drain(t, sub)
	if len(evs) != n {
		t.Fatalf("%d events, want %d", len(evs), n)
	}
	checkConsecutive(t, evs)
	seen := make(map[string]bool)
	for _, ev := range evs {
		if ev.Type != "sandbox.running" || seen[ev.SandboxID] {
			t.Fatalf("unexpected event %+v", ev)
		}
		seen[ev.SandboxID] = true
	}
}

// TestSubscribeLagged: a subscriber that never reads is dropped once its
// buffer is full, without slowing or failing the transitions, while one that
// keeps up gets everything.
func TestSubscribeLagged(t *testing.T) {
	const cycles = lifecycle.SubscriberBuffer/2 + 10 // two events a cycle: more than the buffer
	e := newTestEnv(t, lifecycle.Config{})
	e.seed(t, "app1", lifecycle.Running)
	slow := e.m.Subscribe()
	fast := e.m.Subscribe()
	var got []lifecycle.Event
	ctx := context.Background()
	for i := range cycles {
		if _, err := e.m.Pause(ctx, "app1", "idle"); err != nil {
			t.Fatalf("cycle %d: pause: %v", i, err)
		}
		if _, err := e.m.Wake(ctx, "app1"); err != nil {
			t.Fatalf("cycle %d: wake: %v", i, err)
		}
		// The event is published before the transition returns.
		for range 2 {
			ev, ok := receiveOK(t, fast.C)
			if !ok {
				t.Fatalf("cycle %d: the reading subscriber was dropped (lagged %v)", i, fast.Lagged())
			}
			got = append(got, ev)
		}
	}
	if len(got) != 2*cycles {
		t.Fatalf("reading subscriber got %d events, want %d", len(got), 2*cycles)
	}
	checkConsecutive(t, got)

	buffered := drain(t, slow)
	if !slow.Lagged() {
		t.Fatal("slow subscriber not marked Lagged")
	}
	if len(buffered) != lifecycle.SubscriberBuffer {
		t.Fatalf("slow subscriber got %d events before being dropped, want %d", len(buffered), lifecycle.SubscriberBuffer)
	}
	checkConsecutive(t, buffered)
	if buffered[0].ID != got[0].ID {
		t.Fatalf("slow subscriber starts at %d, want %d", buffered[0].ID, got[0].ID)
	}
	if fast.Lagged() {
		t.Fatal("reading subscriber marked Lagged")
	}
	if s := e.state(t, "app1"); s != lifecycle.Running {
		t.Fatalf("state = %s, want running", s)
	}
	fast.Cancel()
}

func TestCloseEndsSubscriptions(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	subs := []*lifecycle.Subscription{e.m.Subscribe(), e.m.Subscribe()}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	for _, sub := range subs {
		if evs := drain(t, sub); len(evs) != 0 {
			t.Fatalf("got %d events", len(evs))
		}
		if sub.Lagged() {
			t.Fatal("subscription ended by Close reports Lagged")
		}
		sub.Cancel()
	}
}
