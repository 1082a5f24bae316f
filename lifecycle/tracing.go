package lifecycle

import (
	"context"
	"net/netip"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of sandwake's spans.
const TracerName = "github.com/sandwake/sandwake"

// Attributes of sandwake's spans (docs/operations.md, "Traces").
const (
	// AttrSandboxID names the sandbox a span is about.
	AttrSandboxID = attribute.Key("sandwake.sandbox.id")
	// AttrSandboxPort is the sandbox port a span is about.
	AttrSandboxPort = attribute.Key("sandwake.sandbox.port")
	// AttrWakeLed is set on the span of a caller of Wake, JoinWake or
	// StartWake: true when the call started the wake, false when it joined
	// one in flight.
	AttrWakeLed = attribute.Key("sandwake.wake.led")
)

// Names of the spans a traced wake makes, children of its leader's span.
const (
	spanAdmission = "sandwake.admission"
	spanReadiness = "sandwake.readiness"
	spanStart     = "docker.start"
	spanUnpause   = "docker.unpause"
	spanCreate    = "docker.create"
	spanInspect   = "docker.inspect"
)

// span is a span the Manager started, or none (the zero value) when the
// wake is not traced: then end does nothing, and nothing was allocated for
// it.
type span struct{ s trace.Span }

// wakeTracer is the context key of the tracer of a traced wake's flight.
type wakeTracer struct{}

// startSpan starts span name in a traced wake's flight (see traceWake), a
// child of the span in ctx; in an untraced one it does nothing. A port of 0
// is not set.
func startSpan(ctx context.Context, name, id string, port int) (context.Context, span) {
	tracer, ok := ctx.Value(wakeTracer{}).(trace.Tracer)
	if !ok {
		return ctx, span{}
	}
	attrs := []attribute.KeyValue{AttrSandboxID.String(id)}
	if port != 0 {
		attrs = append(attrs, AttrSandboxPort.Int(port))
	}
	ctx, s := tracer.Start(ctx, name, trace.WithAttributes(attrs...))
	return ctx, span{s}
}

// end ends the span, with status Error and err's message when err is set.
func (s span) end(err error) {
	if s.s == nil {
		return
	}
	if err != nil {
		s.s.SetStatus(codes.Error, err.Error())
	}
	s.s.End()
}

// traceWake marks the span of a caller asking for the wake of id, when it
// records: whether the call leads the wake or joins the one in flight (then
// linked to the leader's span, if that one was traced). It returns the
// context the wake is to run in, when this call leads it: the manager's
// (the wake outlives the request, so it never takes the request's
// cancellation), carrying for a traced caller its span's context as the
// parent of the engine's spans and a tracer of its span's provider (never
// a global one). The caller's span may end before the wake does (a warming
// page is answered at once): its children are made all the same. Called
// under mu, which orders leaders and joiners.
func (m *Manager) traceWake(ctx context.Context, id string, leads bool) context.Context {
	caller := trace.SpanFromContext(ctx)
	if !caller.IsRecording() {
		return m.ctx
	}
	caller.SetAttributes(AttrWakeLed.Bool(leads))
	if !leads {
		if sc, ok := m.wakeSpans[id]; ok {
			caller.AddLink(trace.Link{SpanContext: sc})
		}
		return m.ctx
	}
	if m.wakeSpans == nil {
		m.wakeSpans = make(map[string]trace.SpanContext)
	}
	sc := caller.SpanContext()
	m.wakeSpans[id] = sc
	wctx := trace.ContextWithSpanContext(m.ctx, sc)
	return context.WithValue(wctx, wakeTracer{}, caller.TracerProvider().Tracer(TracerName))
}

// The engine calls of a wake, each a span of its own when the wake is
// traced. The Docker client's own HTTP spans are their children.

func (m *Manager) startTraced(ctx context.Context, id string, addr netip.Addr) (Container, error) {
	ctx, s := startSpan(ctx, spanStart, id, 0)
	c, err := m.startBound(ctx, id, addr)
	s.end(err)
	return c, err
}

func (m *Manager) unpauseTraced(ctx context.Context, id string) error {
	ctx, s := startSpan(ctx, spanUnpause, id, 0)
	err := m.runtime.Unpause(ctx, id)
	s.end(err)
	return err
}

func (m *Manager) createTraced(ctx context.Context, id string, spec Spec) error {
	ctx, s := startSpan(ctx, spanCreate, id, 0)
	_, err := m.runtime.Create(ctx, id, spec)
	s.end(err)
	return err
}

func (m *Manager) inspectTraced(ctx context.Context, id string) (Container, error) {
	ctx, s := startSpan(ctx, spanInspect, id, 0)
	c, err := m.runtime.Inspect(ctx, id)
	s.end(err)
	return c, err
}
