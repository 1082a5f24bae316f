package preview_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/preview"
)

// testExporter receives what Caddy's tracing directive exports in these
// tests: it is the span exporter named "sandwake_test", which
// OTEL_TRACES_EXPORTER selects, as it would select otlp or console.
var testExporter atomic.Pointer[tracetest.InMemoryExporter]

func init() {
	autoexport.RegisterSpanExporter("sandwake_test", func(context.Context) (sdktrace.SpanExporter, error) {
		if e := testExporter.Load(); e != nil {
			return e, nil
		}
		return nil, errors.New("no test span exporter set")
	})
}

// tracedHeader is h with a W3C traceparent naming a new sampled trace, the
// trace's id (the gateway's spans of the request are in it) and the
// parent's span id (the parent of Caddy's server span).
func tracedHeader(h http.Header) (http.Header, trace.TraceID, trace.SpanID) {
	var tid trace.TraceID
	var sid trace.SpanID
	rand.Read(tid[:])
	rand.Read(sid[:])
	h = h.Clone()
	h.Set("Traceparent", fmt.Sprintf("00-%s-%s-01", tid, sid))
	return h, tid, sid
}

// TestWakeTraceThroughCaddy: with Caddy's tracing directive on the preview
// site, a request that wakes a stopped sandbox on the real engine gets a
// sandwake.wake span under Caddy's server span, with hold, admission,
// docker.start (the Docker client's call under it), readiness and proxy
// spans under that, all exported by the directive's own exporter. A page
// load gets the warming page and leads the next wake; an API request
// joining that wake is marked and linked to it. A request to the running
// sandbox gets no sandwake span at all.
func TestWakeTraceThroughCaddy(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	testExporter.Store(exp)
	t.Setenv("OTEL_TRACES_EXPORTER", "sandwake_test")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50") // ms: spans reach the exporter soon
	h := newHarnessWithCaddyfile(t, func(h *harness) string {
		return strings.Replace(h.Caddyfile("wake_timeout 60s"), "\tsandwake_preview\n", "\ttracing {\n\t\tspan preview\n\t}\n\tsandwake_preview\n", 1)
	})
	// The app listens a while after its start, so that a wake is still in
	// flight when the joining request arrives.
	rec := h.Create(map[string]string{"STARTUP_DELAY": "2s"})
	host := h.Host(rec.ID, 8080)

	// traced waits until trace id holds Caddy's server span and whatever
	// done asks of the trace's spans, and returns the server span and the
	// spans.
	traced := func(id trace.TraceID, parent trace.SpanID, done func(preview.Spans) (bool, string)) (tracetest.SpanStub, preview.Spans) {
		t.Helper()
		var server tracetest.SpanStub
		var got preview.Spans
		testenv.Eventually(t, 30*time.Second, func() (bool, string) {
			got = preview.Spans(exp.GetSpans()).InTrace(id)
			servers := got.Named("preview")
			if len(servers) != 1 {
				return false, fmt.Sprintf("no server span yet: %v", got.Names())
			}
			server = servers[0]
			return done(got)
		})
		if server.Parent.SpanID() != parent {
			t.Fatalf("server span's parent %s, want the traceparent's %s", server.Parent.SpanID(), parent)
		}
		return server, got
	}
	wakeDone := func(children ...string) func(preview.Spans) (bool, string) {
		return func(ss preview.Spans) (bool, string) {
			wakes := ss.Named(preview.SpanWake)
			if len(wakes) != 1 {
				return false, fmt.Sprintf("spans %v", ss.Names())
			}
			got := ss.ChildrenOf(wakes[0]).Names()
			return slices.Equal(got, children), fmt.Sprintf("wake span's children %v, want %v", got, children)
		}
	}

	// An API request to the stopped sandbox leads its wake.
	h.Stop(rec.ID)
	header, tid, parent := tracedHeader(gatewaytest.APIHeader())
	resp, body := h.Preview("GET", host, "/", nil, header)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Hello from the sandbox") {
		t.Fatalf("held request: %d %.300q", resp.StatusCode, body)
	}
	server, all := traced(tid, parent, wakeDone("docker.start", "sandwake.admission", "sandwake.hold", "sandwake.proxy", "sandwake.readiness"))
	wake := all.One(t, preview.SpanWake)
	if wake.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("wake span's parent %s, want Caddy's server span %s", wake.Parent.SpanID(), server.SpanContext.SpanID())
	}
	preview.CheckAttrs(t, wake, map[attribute.Key]string{
		lifecycle.AttrSandboxID: rec.ID, lifecycle.AttrSandboxPort: "8080",
		preview.AttrOutcome: preview.WakeReady, lifecycle.AttrWakeLed: "true",
	})
	for _, name := range []string{"docker.start", "sandwake.readiness"} {
		preview.CheckAttrs(t, all.One(t, name), map[attribute.Key]string{lifecycle.AttrSandboxID: rec.ID})
	}
	// The engine call is the Docker client's own span's parent.
	calls := all.ChildrenOf(all.One(t, "docker.start")).Names()
	if !slices.ContainsFunc(calls, func(n string) bool { return strings.HasPrefix(n, "POST ") && strings.HasSuffix(n, "/start") }) {
		t.Errorf("docker.start's children %v, want the Docker client's POST …/start", calls)
	}

	// A page load gets the warming page and leads the next wake; an API
	// request sent meanwhile joins it.
	h.Stop(rec.ID)
	pageHeader, pageTrace, pageParent := tracedHeader(gatewaytest.BrowserHeader())
	resp, body = h.Preview("GET", host, "/", nil, pageHeader)
	if resp.StatusCode != http.StatusServiceUnavailable || pageKind(body) != preview.PageWarming {
		t.Fatalf("page load: %d kind %q", resp.StatusCode, pageKind(body))
	}
	header, tid, parent = tracedHeader(gatewaytest.APIHeader())
	resp, body = h.Preview("GET", host, "/", nil, header)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Hello from the sandbox") {
		t.Fatalf("joining request: %d %.300q", resp.StatusCode, body)
	}
	_, pageSpans := traced(pageTrace, pageParent, wakeDone("docker.start", "sandwake.admission", "sandwake.readiness"))
	leader := pageSpans.One(t, preview.SpanWake)
	preview.CheckAttrs(t, leader, map[attribute.Key]string{preview.AttrOutcome: preview.WakeWarmingPage, lifecycle.AttrWakeLed: "true"})
	_, joinSpans := traced(tid, parent, wakeDone("sandwake.hold", "sandwake.proxy"))
	joiner := joinSpans.One(t, preview.SpanWake)
	preview.CheckAttrs(t, joiner, map[attribute.Key]string{preview.AttrOutcome: preview.WakeReady, lifecycle.AttrWakeLed: "false"})
	if len(joiner.Links) != 1 || joiner.Links[0].SpanContext.SpanID() != leader.SpanContext.SpanID() {
		t.Errorf("joiner's links %+v, want one to the page load's wake span %s", joiner.Links, leader.SpanContext.SpanID())
	}

	// The running sandbox: Caddy's span only.
	header, tid, parent = tracedHeader(gatewaytest.APIHeader())
	resp, body = h.Preview("GET", host, "/", nil, header)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Hello from the sandbox") {
		t.Fatalf("request to the running sandbox: %d %.300q", resp.StatusCode, body)
	}
	_, hot := traced(tid, parent, func(preview.Spans) (bool, string) { return true, "" })
	if got := hot.Names(); !slices.Equal(got, []string{"preview"}) {
		t.Errorf("spans of a request to the running sandbox %v, want only Caddy's", got)
	}
}
