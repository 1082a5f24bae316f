package lifecycle_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sandwake/sandwake/lifecycle"
)

// TestCloseIsBounded: Close cancels the work in flight and waits for it,
// but a call that ignores cancellation (a held engine call) does not hold
// it past CloseTimeout: Close then returns ErrCloseTimeout naming the work
// still running, and logs what it waits for while it waits.
func TestCloseIsBounded(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	const bound = 1500 * time.Millisecond
	e := newTestEnv(t, lifecycle.Config{CloseTimeout: bound, Logger: zap.New(core)})
	e.seed(t, "app1", lifecycle.Stopped)
	g := e.rt.Hold(t, "Start", "app1")
	go e.m.Wake(context.Background(), "app1")
	receive(t, g.Entered, "the start")

	start := time.Now()
	err := e.m.Close()
	took := time.Since(start)
	if !errors.Is(err, lifecycle.ErrCloseTimeout) || !strings.Contains(err.Error(), "wake app1") {
		t.Fatalf("Close with a held wake: %v, want ErrCloseTimeout naming wake app1", err)
	}
	if took < bound || took > bound+5*time.Second {
		t.Fatalf("Close took %s, want its bound %s", took, bound)
	}
	waiting := logs.FilterMessageSnippet("waiting for work in flight").All()
	if len(waiting) != 1 || !strings.Contains(waiting[0].ContextMap()["waiting_for"].(string), "wake app1") {
		t.Fatalf("log while waiting: %v", waiting)
	}
	if gaveUp := logs.FilterMessageSnippet("without waiting any longer").All(); len(gaveUp) != 1 {
		t.Fatalf("log of the bound: %v", gaveUp)
	}
	g.Release()
}

// TestCloseWaitsForWorkThatEnds: work that ends on cancellation is waited
// for, and Close then returns nil without logging that it waits.
func TestCloseWaitsForWorkThatEnds(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	e := newTestEnv(t, lifecycle.Config{Logger: zap.New(core)})
	e.seed(t, "app1", lifecycle.Stopped)
	if _, err := e.m.Wake(context.Background(), "app1"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := logs.FilterMessageSnippet("waiting for work in flight").Len(); n != 0 {
		t.Fatalf("Close logged %d waits with nothing in flight", n)
	}
}
