package preview

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// Spans is a set of ended spans, as an exporter receives them.
type Spans []tracetest.SpanStub

// Named returns the spans called name.
func (ss Spans) Named(name string) Spans {
	var out Spans
	for _, s := range ss {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// One returns the only span called name, failing the test if there is not
// exactly one.
func (ss Spans) One(t testing.TB, name string) tracetest.SpanStub {
	t.Helper()
	got := ss.Named(name)
	if len(got) != 1 {
		t.Fatalf("%d spans %s, want 1 (spans: %v)", len(got), name, ss.Names())
	}
	return got[0]
}

// ChildrenOf returns the spans whose parent is p.
func (ss Spans) ChildrenOf(p tracetest.SpanStub) Spans {
	var out Spans
	for _, s := range ss {
		if s.Parent.SpanID() == p.SpanContext.SpanID() && s.Parent.TraceID() == p.SpanContext.TraceID() {
			out = append(out, s)
		}
	}
	return out
}

// InTrace returns the spans of trace id.
func (ss Spans) InTrace(id trace.TraceID) Spans {
	var out Spans
	for _, s := range ss {
		if s.SpanContext.TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// Names returns the spans' names, sorted.
func (ss Spans) Names() []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name)
	}
	slices.Sort(out)
	return out
}

// attrOf returns the value of s's attribute key ("" and false when unset),
// as a string.
func attrOf(s tracetest.SpanStub, key attribute.Key) (string, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.String(), true
		}
	}
	return "", false
}

// CheckAttrs fails the test for every attribute of s that is not as want
// says ("" wants the attribute unset).
func CheckAttrs(t testing.TB, s tracetest.SpanStub, want map[attribute.Key]string) {
	t.Helper()
	for k, v := range want {
		if got, ok := attrOf(s, k); got != v || ok != (v != "") {
			t.Errorf("span %s: %s = %q (set %v), want %q", s.Name, k, got, ok, v)
		}
	}
}

// recorded is a tracer provider recording into memory, as Caddy's tracing
// directive's provider would export.
type recorded struct {
	tp  *sdktrace.TracerProvider
	rec *tracetest.SpanRecorder
}

func newRecorded(t testing.TB) recorded {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return recorded{tp: tp, rec: rec}
}

func (r recorded) ended() Spans { return Spans(tracetest.SpanStubsFromReadOnlySpans(r.rec.Ended())) }

// serveTraced sends a request to the unit gate inside a span of its own
// (what Caddy's tracing handler does before the gate runs) and returns the
// answer and that span.
func (u *unitGate) serveTraced(t testing.TB, r recorded, header http.Header) (*httptest.ResponseRecorder, trace.Span) {
	t.Helper()
	req := hotRequest()
	req.Host, req.Header = "s-app-8080.preview.localhost", header.Clone()
	ctx, span := r.tp.Tracer("test").Start(req.Context(), "request")
	defer span.End()
	w := httptest.NewRecorder()
	if err := u.g.ServeHTTP(w, req.WithContext(ctx), caddyhttp.HandlerFunc(proxied)); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	return w, span
}

// TestWakeSpans: a traced request that wakes a sandbox gets a
// sandwake.wake span under its own, naming the sandbox, port, outcome and
// whether it led the wake, with hold, engine, readiness and proxy spans
// under it as far as its wake got; a request to a running sandbox gets
// none.
func TestWakeSpans(t *testing.T) {
	page := pageHeader()
	tests := []struct {
		name       string
		state      lifecycle.State
		header     http.Header
		failStart  error
		holdStart  bool // the start waits until the test ends
		holdFor    time.Duration
		wantStatus int
		outcome    string
		children   []string // of sandwake.wake
		errored    []string // Spans with status Error (sandwake.wake among them, if so)
	}{
		{name: "held until ready", state: lifecycle.Stopped, header: http.Header{"Accept": {"application/json"}}, wantStatus: http.StatusOK, outcome: wakeReady,
			children: []string{"docker.start", "sandwake.admission", "sandwake.hold", "sandwake.proxy", "sandwake.readiness"}},
		{name: "paused", state: lifecycle.Paused, header: http.Header{"Accept": {"application/json"}}, wantStatus: http.StatusOK, outcome: wakeReady,
			children: []string{"docker.unpause", "sandwake.hold", "sandwake.proxy", "sandwake.readiness"}},
		{name: "wake fails", state: lifecycle.Stopped, header: http.Header{"Accept": {"application/json"}}, wantStatus: http.StatusServiceUnavailable, outcome: wakeFailed,
			failStart: fmt.Errorf("engine gone: %w", lifecycle.ErrUnavailable),
			children:  []string{"docker.start", "sandwake.admission", "sandwake.hold"},
			errored:   []string{"docker.start", "sandwake.hold", "sandwake.wake"}},
		{name: "hold times out", state: lifecycle.Stopped, header: http.Header{"Accept": {"application/json"}}, wantStatus: http.StatusServiceUnavailable, outcome: wakeTimeout,
			holdStart: true, holdFor: 100 * time.Millisecond,
			// The engine's spans end with the wake, after the request.
			children: []string{"sandwake.admission", "sandwake.hold"},
			errored:  []string{"sandwake.hold", "sandwake.wake"}},
		{name: "warming page", state: lifecycle.Stopped, header: page, wantStatus: http.StatusServiceUnavailable, outcome: wakeWarmingPage,
			// The wake goes on after the page: its spans end later.
			children: []string{"docker.start", "sandwake.admission", "sandwake.readiness"}},
		{name: "running", state: lifecycle.Running, header: http.Header{"Accept": {"application/json"}}, wantStatus: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUnitGate(t, *unitRecord("app", tt.state, nil))
			if tt.failStart != nil {
				u.rt.FailWith("Start", tt.failStart)
			}
			if tt.holdStart {
				u.rt.Hold(t, "Start", "app")
			}
			if tt.holdFor > 0 {
				s := *u.e.Current.Load()
				s.HoldTimeout = tt.holdFor
				u.e.Current.Store(&s)
			}
			r := newRecorded(t)
			w, request := u.serveTraced(t, r, tt.header)
			if w.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.wantStatus, w.Body)
			}
			if tt.outcome == "" {
				if got := r.ended().Names(); !slices.Equal(got, []string{"request"}) {
					t.Fatalf("spans %v, want only the request's", got)
				}
				return
			}
			var all Spans
			var wake tracetest.SpanStub
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				all = r.ended()
				wakes := all.Named(spanWake)
				if len(wakes) != 1 {
					return false, fmt.Sprintf("spans %v", all.Names())
				}
				wake = wakes[0]
				got := all.ChildrenOf(wake).Names()
				return slices.Equal(got, tt.children), fmt.Sprintf("children of the wake span %v, want %v", got, tt.children)
			})
			if wake.Parent.SpanID() != request.SpanContext().SpanID() {
				t.Errorf("wake span's parent %s, want the request's span %s", wake.Parent.SpanID(), request.SpanContext().SpanID())
			}
			CheckAttrs(t, wake, map[attribute.Key]string{
				lifecycle.AttrSandboxID: "app", lifecycle.AttrSandboxPort: "8080",
				attrOutcome: tt.outcome, lifecycle.AttrWakeLed: "true",
			})
			for _, s := range all.InTrace(request.SpanContext().TraceID()) {
				failed := s.Status.Code == codes.Error
				if failed != slices.Contains(tt.errored, s.Name) {
					t.Errorf("span %s: status %v %q", s.Name, s.Status.Code, s.Status.Description)
				}
			}
			if tt.failStart != nil && !strings.Contains(wake.Status.Description, tt.failStart.Error()) {
				t.Errorf("wake span's status %q, want the engine's error", wake.Status.Description)
			}
		})
	}
}

// TestJoinedWakeSpans: a request that joins a wake another request leads
// gets a wake span marked as not leading, linked to the leader's, with hold
// and proxy spans and no engine span.
func TestJoinedWakeSpans(t *testing.T) {
	u := newUnitGate(t, *unitRecord("app", lifecycle.Stopped, nil))
	g := u.rt.Hold(t, "Start", "app")
	r := newRecorded(t)
	// A browser leads the wake and gets the warming page at once.
	w, _ := u.serveTraced(t, r, pageHeader())
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("page load: %d %s", w.Code, w.Body)
	}
	<-g.Entered
	type answer struct {
		w    *httptest.ResponseRecorder
		span trace.Span
	}
	answered := make(chan answer, 1)
	go func() {
		w, span := u.serveTraced(t, r, http.Header{"Accept": {"application/json"}})
		answered <- answer{w, span}
	}()
	// The held request's wake span is marked as it joins the wake.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		for _, s := range r.rec.Started() {
			for _, kv := range s.Attributes() {
				if s.Name() == spanWake && kv.Key == lifecycle.AttrWakeLed && !kv.Value.AsBool() {
					return true, ""
				}
			}
		}
		return false, "the held request has not joined the wake"
	})
	g.Release()
	a := <-answered
	if a.w.Code != http.StatusOK {
		t.Fatalf("held request: %d %s", a.w.Code, a.w.Body)
	}
	var all Spans
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		all = r.ended()
		return len(all.Named(spanWake)) == 2 && len(all.Named("sandwake.readiness")) == 1, fmt.Sprintf("spans %v", all.Names())
	})
	var leader, joiner tracetest.SpanStub
	for _, s := range all.Named(spanWake) {
		if s.Parent.TraceID() == a.span.SpanContext().TraceID() {
			joiner = s
		} else {
			leader = s
		}
	}
	CheckAttrs(t, leader, map[attribute.Key]string{attrOutcome: wakeWarmingPage, lifecycle.AttrWakeLed: "true"})
	CheckAttrs(t, joiner, map[attribute.Key]string{attrOutcome: wakeReady, lifecycle.AttrWakeLed: "false"})
	if got, want := all.ChildrenOf(joiner).Names(), []string{"sandwake.hold", "sandwake.proxy"}; !slices.Equal(got, want) {
		t.Errorf("joiner's children %v, want %v", got, want)
	}
	if got := all.ChildrenOf(leader).Names(); !slices.Contains(got, "docker.start") {
		t.Errorf("leader's children %v, want docker.start among them", got)
	}
	if len(joiner.Links) != 1 || joiner.Links[0].SpanContext.SpanID() != leader.SpanContext.SpanID() {
		t.Errorf("joiner's links %+v, want one to the leader's wake span %s", joiner.Links, leader.SpanContext.SpanID())
	}
}

// countingProvider counts the tracers asked of it.
type countingProvider struct {
	noop.TracerProvider
	tracers *atomic.Int32
}

func (p countingProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	p.tracers.Add(1)
	return p.TracerProvider.Tracer(name, opts...)
}

// unsampledSpan is a request's span that is valid but does not record (a
// request the sampler left out), from a countingProvider.
type unsampledSpan struct {
	noop.Span
	tp countingProvider
}

func (s unsampledSpan) TracerProvider() trace.TracerProvider { return s.tp }

func (s unsampledSpan) SpanContext() trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})
}

// TestWakeUntracedMakesNoSpan: a request whose span does not record (or
// that has none) wakes, is held and proxied, or gets the warming page,
// without sandwake asking any tracer for anything.
func TestWakeUntracedMakesNoSpan(t *testing.T) {
	tracers := new(atomic.Int32)
	unsampled := unsampledSpan{tp: countingProvider{tracers: tracers}}
	for _, header := range []http.Header{http.Header{"Accept": {"application/json"}}, pageHeader()} {
		for _, span := range []trace.Span{nil, unsampled} {
			u := newUnitGate(t, *unitRecord("app", lifecycle.Stopped, nil))
			r := hotRequest()
			r.Host, r.Header = "s-app-8080.preview.localhost", header.Clone()
			if span != nil {
				r = r.WithContext(trace.ContextWithSpan(r.Context(), span))
			}
			w := httptest.NewRecorder()
			if err := u.g.ServeHTTP(w, r, caddyhttp.HandlerFunc(proxied)); err != nil {
				t.Fatal(err)
			}
			if w.Code != http.StatusOK && w.Code != http.StatusServiceUnavailable {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				st, _ := u.e.Mgr.Get("app")
				return st.State == lifecycle.Running, "state " + string(st.State)
			})
		}
	}
	if n := tracers.Load(); n != 0 {
		t.Fatalf("%d tracers asked for by untraced requests, want 0", n)
	}
}

// pageHeader is what a browser sends for a page load (as
// gatewaytest.BrowserHeader, which this package's own tests cannot import).
func pageHeader() http.Header {
	return http.Header{
		"Accept":         {"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"},
		"Sec-Fetch-Mode": {"navigate"},
		"Sec-Fetch-Dest": {"document"},
	}
}
