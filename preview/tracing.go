package preview

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandwake/sandwake/lifecycle"
)

// Spans of a request that wakes a sandbox or waits for its wake, made only
// when the request's span records (Caddy's tracing directive): children of
// that span, from its own tracer provider. Requests to running sandboxes get
// none. docs/operations.md ("Traces") lists them.
const (
	spanWake  = "sandwake.wake"
	spanHold  = "sandwake.hold"
	spanProxy = "sandwake.proxy"

	// attrOutcome is how the request's wake ended for it.
	attrOutcome = attribute.Key("sandwake.wake.outcome")
)

// Outcomes of a traced wake (attrOutcome).
const (
	wakeReady       = "ready"        // woken (or found running) and proxied
	wakeFailed      = "failed"       // the wake failed; the status says why
	wakeTimeout     = "timeout"      // hold_timeout passed first
	wakeClientGone  = "client_gone"  // the client left while held
	wakeNotWoken    = "not_woken"    // a wake to join had ended, the sandbox down
	wakeWarmingPage = "warming_page" // a browser got the warming page
	wakeRequested   = "requested"    // POST /.well-known/sandwake/wake
	wakeBusy        = "busy"         // woken, but no slot came (max_open_per_sandbox)
)

// wakeTrace is the sandwake.wake span of one request, or none (the zero
// value) when the request's span does not record: then every method does
// nothing.
type wakeTrace struct {
	span   trace.Span
	tracer trace.Tracer
}

// startWakeTrace starts the sandwake.wake span of a request to sandbox id's
// port when ctx carries a recording span, and returns ctx with it: the
// Manager's Wake, JoinWake and StartWake mark it as leading or joining,
// and a wake it leads puts its engine spans under it.
func startWakeTrace(ctx context.Context, id string, port int) (context.Context, wakeTrace) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, wakeTrace{}
	}
	tracer := parent.TracerProvider().Tracer(lifecycle.TracerName)
	ctx, s := tracer.Start(ctx, spanWake, trace.WithAttributes(
		lifecycle.AttrSandboxID.String(id), lifecycle.AttrSandboxPort.Int(port)))
	return ctx, wakeTrace{span: s, tracer: tracer}
}

// child starts a child span (hold, proxy) of the wake span; ctx must carry
// the wake span.
func (t wakeTrace) child(ctx context.Context, name string) childSpan {
	if t.span == nil {
		return childSpan{}
	}
	_, s := t.tracer.Start(ctx, name)
	return childSpan{s}
}

// joined marks a request that rides on a wake without asking the Manager
// for it (the warming page of a wake already in flight).
func (t wakeTrace) joined() {
	if t.span != nil {
		t.span.SetAttributes(lifecycle.AttrWakeLed.Bool(false))
	}
}

// end ends the wake span with its outcome and, for a failure, its cause as
// status Error.
func (t wakeTrace) end(outcome string, cause error) {
	if t.span == nil {
		return
	}
	t.span.SetAttributes(attrOutcome.String(outcome))
	if cause != nil {
		t.span.SetStatus(codes.Error, cause.Error())
	}
	t.span.End()
}

// childSpan is a child of a wake span, or none.
type childSpan struct{ s trace.Span }

// end ends the span, with status Error and err's message when err is set.
func (c childSpan) end(err error) {
	if c.s == nil {
		return
	}
	if err != nil {
		c.s.SetStatus(codes.Error, err.Error())
	}
	c.s.End()
}
