package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Circuit breaker settings: after breakerThreshold consecutive transient
// engine failures, calls fail fast for breakerCooldown instead of each
// waiting for a dead daemon's timeout.
const (
	breakerThreshold = 5
	breakerCooldown  = 30 * time.Second
)

// breaker is a Runtime that stops calling the engine after repeated
// transient failures. Only ErrUnavailable counts; an answer of any kind
// (success, not found, a refused start) closes it again.
type breaker struct {
	rt  Runtime
	now func() time.Time
	// log gets the engine's own words of every failure (see EngineError),
	// which API callers are not told.
	log *zap.Logger

	mu        sync.Mutex
	failures  int
	openUntil time.Time
}

// BreakerOpen reports whether engine calls currently fail fast, and until when.
func (m *Manager) BreakerOpen() (bool, time.Time) {
	b := m.breaker
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now().Before(b.openUntil), b.openUntil
}

// do calls fn, the runtime's op on sandbox id ("" for none), unless the
// circuit is open.
func (b *breaker) do(op, id string, fn func() error) error {
	b.mu.Lock()
	if until := b.openUntil; b.now().Before(until) {
		b.mu.Unlock()
		return fmt.Errorf("%w after %d consecutive engine failures, retrying after %s",
			ErrCircuitOpen, breakerThreshold, until.UTC().Format(time.RFC3339))
	}
	b.mu.Unlock()
	err := fn()
	if ee, ok := errors.AsType[*EngineError](err); ok && b.log != nil {
		// Where the reference an answer gives leads: the engine's words.
		level := zap.WarnLevel
		if errors.Is(err, ErrContainerNotFound) || errors.Is(err, ErrNotFound) || errors.Is(err, context.Canceled) {
			level = zap.DebugLevel
		}
		b.log.Log(level, "engine error", zap.String("op", op), zap.String("id", id), zap.String("ref", ee.Ref), zap.Error(err))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case errors.Is(err, context.Canceled):
		// The caller gave up: nothing learnt about the engine.
	case errors.Is(err, ErrUnavailable):
		b.failures++
		if b.failures >= breakerThreshold {
			b.openUntil = b.now().Add(breakerCooldown)
			b.failures = 0
		}
	default:
		// The engine answered: it is back.
		b.failures, b.openUntil = 0, time.Time{}
	}
	return err
}

func (b *breaker) Create(ctx context.Context, id string, spec Spec) (c Container, err error) {
	err = b.do("create", id, func() error { c, err = b.rt.Create(ctx, id, spec); return err })
	return c, err
}

func (b *breaker) Start(ctx context.Context, id string) (c Container, err error) {
	err = b.do("start", id, func() error { c, err = b.rt.Start(ctx, id); return err })
	return c, err
}

func (b *breaker) Pause(ctx context.Context, id string) error {
	return b.do("pause", id, func() error { return b.rt.Pause(ctx, id) })
}

func (b *breaker) Unpause(ctx context.Context, id string) error {
	return b.do("unpause", id, func() error { return b.rt.Unpause(ctx, id) })
}

func (b *breaker) Stop(ctx context.Context, id string) error {
	return b.do("stop", id, func() error { return b.rt.Stop(ctx, id) })
}

func (b *breaker) Remove(ctx context.Context, id string) error {
	return b.do("remove", id, func() error { return b.rt.Remove(ctx, id) })
}

func (b *breaker) RemoveVolume(ctx context.Context, id string) (n int64, err error) {
	err = b.do("remove volume", id, func() error { n, err = b.rt.RemoveVolume(ctx, id); return err })
	return n, err
}

func (b *breaker) Inspect(ctx context.Context, id string) (c Container, err error) {
	err = b.do("inspect", id, func() error { c, err = b.rt.Inspect(ctx, id); return err })
	return c, err
}

func (b *breaker) List(ctx context.Context) (cs []Container, err error) {
	err = b.do("list", "", func() error { cs, err = b.rt.List(ctx); return err })
	return cs, err
}

// Ping always reaches the engine: it is how readiness learns the daemon is
// back, and a success closes the circuit.
func (b *breaker) Ping(ctx context.Context) error {
	err := b.rt.Ping(ctx)
	if err == nil {
		b.mu.Lock()
		b.failures, b.openUntil = 0, time.Time{}
		b.mu.Unlock()
	}
	return err
}

var _ Runtime = (*breaker)(nil)
