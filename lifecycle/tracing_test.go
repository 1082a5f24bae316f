package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sandwake/sandwake/lifecycle"
)

// tracedCaller is a caller's span from a provider of its own, as Caddy's
// tracing handler puts one in a request's context.
type tracedCaller struct {
	ctx  context.Context
	span trace.Span
	rec  *tracetest.SpanRecorder
}

func newTracedCaller(t *testing.T) tracedCaller {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	return tracedCaller{ctx: ctx, span: span, rec: rec}
}

// children returns the names of the ended spans whose parent is the
// caller's span, sorted.
func (c tracedCaller) children() []string {
	var names []string
	for _, s := range c.rec.Ended() {
		if s.Parent().SpanID() == c.span.SpanContext().SpanID() {
			names = append(names, s.Name())
		}
	}
	slices.Sort(names)
	return names
}

// ended returns the caller's ended span named name.
func (c tracedCaller) ended(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range c.rec.Ended() {
		if s.Name() == name {
			return s
		}
	}
	t.Fatalf("no span %s", name)
	return nil
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestWakeTraced: a wake whose caller's span records makes the engine call
// its state asks for, admission and readiness child spans of that span,
// each naming the sandbox, and marks the caller as the wake's leader; a
// failed engine call carries its error as the span's status.
func TestWakeTraced(t *testing.T) {
	engineDown := fmt.Errorf("docker: %w", lifecycle.ErrUnavailable)
	cases := []struct {
		name     string
		from     lifecycle.State
		fail     string // a runtime method that fails with engineDown
		children []string
		failed   string // the span with status Error
	}{
		{name: "stopped", from: lifecycle.Stopped,
			children: []string{"docker.start", "sandwake.admission", "sandwake.readiness"}},
		{name: "paused", from: lifecycle.Paused,
			children: []string{"docker.unpause", "sandwake.readiness"}},
		{name: "killed", from: lifecycle.Killed,
			children: []string{"docker.create", "docker.start", "sandwake.admission", "sandwake.readiness"}},
		{name: "start fails", from: lifecycle.Stopped, fail: "Start",
			children: []string{"docker.start", "sandwake.admission"}, failed: "docker.start"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, lifecycle.Config{})
			e.seed(t, "app1", tc.from)
			if tc.fail != "" {
				e.rt.FailWith(tc.fail, engineDown)
			}
			c := newTracedCaller(t)
			_, err := e.m.Wake(c.ctx, "app1")
			if (err != nil) != (tc.fail != "") {
				t.Fatalf("wake: %v", err)
			}
			if got := c.children(); !slices.Equal(got, tc.children) {
				t.Fatalf("child spans %v, want %v", got, tc.children)
			}
			for _, name := range tc.children {
				s := c.ended(t, name)
				if v, _ := attr(s, lifecycle.AttrSandboxID); v.AsString() != "app1" {
					t.Errorf("%s: sandbox id %q, want app1", name, v.AsString())
				}
				failed := s.Status().Code == codes.Error
				if failed != (name == tc.failed) {
					t.Errorf("%s: status %v %q", name, s.Status().Code, s.Status().Description)
				}
				if failed && !strings.Contains(s.Status().Description, engineDown.Error()) {
					t.Errorf("%s: status message %q, want the engine's error", name, s.Status().Description)
				}
			}
			if tc.failed == "" {
				if v, _ := attr(c.ended(t, "sandwake.readiness"), lifecycle.AttrSandboxPort); v.AsInt64() != testPort {
					t.Errorf("readiness port %d, want %d", v.AsInt64(), testPort)
				}
			}
			c.span.End()
			if v, ok := attr(c.ended(t, "request"), lifecycle.AttrWakeLed); !ok || !v.AsBool() {
				t.Errorf("caller's span: sandwake.wake.led = %v (set %v), want true", v.AsBool(), ok)
			}
		})
	}
}

// TestJoinedWakeTraced: a caller that joins a wake in flight is marked as
// not leading it and linked to the leader's span; the engine's spans are
// the leader's only.
func TestJoinedWakeTraced(t *testing.T) {
	e := newTestEnv(t, lifecycle.Config{})
	e.seed(t, "app1", lifecycle.Stopped)
	g := e.rt.Hold(t, "Start", "app1")
	leader, joiner := newTracedCaller(t), newTracedCaller(t)
	led := make(chan error, 1)
	go func() {
		_, err := e.m.Wake(leader.ctx, "app1")
		led <- err
	}()
	receive(t, g.Entered, "the leader's start")
	joined := make(chan error, 1)
	go func() {
		_, ok, err := e.m.JoinWake(joiner.ctx, "app1")
		if !ok {
			err = errors.New("JoinWake found no wake in flight")
		}
		joined <- err
	}()
	// The joiner is marked as it joins, before the wake ends.
	waitFor(t, "the joiner to join", func() bool {
		_, ok := attr(joiner.span.(sdktrace.ReadOnlySpan), lifecycle.AttrWakeLed)
		return ok
	})
	g.Release()
	if err := receive(t, led, "the leader's wake"); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, joined, "the joined wake"); err != nil {
		t.Fatal(err)
	}
	leader.span.End()
	joiner.span.End()

	if v, _ := attr(leader.ended(t, "request"), lifecycle.AttrWakeLed); !v.AsBool() {
		t.Error("leader: sandwake.wake.led = false, want true")
	}
	js := joiner.ended(t, "request")
	if v, _ := attr(js, lifecycle.AttrWakeLed); v.AsBool() {
		t.Error("joiner: sandwake.wake.led = true, want false")
	}
	if links := js.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != leader.span.SpanContext().SpanID() {
		t.Errorf("joiner's links %+v, want one to the leader's span %s", links, leader.span.SpanContext().SpanID())
	}
	if got := leader.children(); !slices.Contains(got, "docker.start") {
		t.Errorf("leader's child spans %v, want docker.start among them", got)
	}
	if got := joiner.children(); len(got) != 0 {
		t.Errorf("joiner's child spans %v, want none", got)
	}
}

// countingProvider counts the tracers asked of it: sandwake must ask none
// for a caller whose span does not record.
type countingProvider struct {
	noop.TracerProvider
	tracers *atomic.Int32
}

func (p countingProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	p.tracers.Add(1)
	return p.TracerProvider.Tracer(name, opts...)
}

// unsampledSpan is a caller's span that is valid but does not record (a
// request the sampler left out), from a countingProvider.
type unsampledSpan struct {
	noop.Span
	tp countingProvider
}

func (s unsampledSpan) TracerProvider() trace.TracerProvider { return s.tp }

func (s unsampledSpan) SpanContext() trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})
}

// TestWakeUntracedMakesNoSpan: a wake led, started or joined by a caller
// that carries no span, or one that does not record, asks no tracer for
// anything.
func TestWakeUntracedMakesNoSpan(t *testing.T) {
	tracers := new(atomic.Int32)
	unsampled := trace.ContextWithSpan(context.Background(), unsampledSpan{tp: countingProvider{tracers: tracers}})
	if trace.SpanFromContext(unsampled).IsRecording() || !trace.SpanContextFromContext(unsampled).IsValid() {
		t.Fatal("the unsampled span must be valid and not recording")
	}
	for _, ctx := range []context.Context{context.Background(), unsampled} {
		e := newTestEnv(t, lifecycle.Config{})
		e.seed(t, "app1", lifecycle.Stopped)
		e.seed(t, "app2", lifecycle.Stopped)
		if _, err := e.m.Wake(ctx, "app2"); err != nil {
			t.Fatal(err)
		}
		g := e.rt.Hold(t, "Start", "app1")
		e.m.StartWake(ctx, "app1")
		receive(t, g.Entered, "the start")
		// Both join the wake in flight, then return at once: their
		// context is cancelled (and carries the same span, or none).
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := e.m.Wake(cancelled, "app1"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wake joining with a cancelled context: %v", err)
		}
		if _, ok, err := e.m.JoinWake(cancelled, "app1"); !ok || !errors.Is(err, context.Canceled) {
			t.Fatalf("JoinWake = %v, %v; want joined and cancelled", ok, err)
		}
		g.Release()
		waitFor(t, "the wake to end", func() bool { _, ok := e.m.Waking("app1"); return !ok })
		if st := e.state(t, "app1"); st != lifecycle.Running {
			t.Fatalf("app1 is %s, want running", st)
		}
	}
	if n := tracers.Load(); n != 0 {
		t.Fatalf("%d tracers asked for by untraced wakes, want 0", n)
	}
}
