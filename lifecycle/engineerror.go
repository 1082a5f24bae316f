package lifecycle

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"go.uber.org/zap"
)

// EngineError is the container engine's own account of a failure. Its
// words can name the engine's host (its data directories, a storage
// driver's layer ids, its socket), so they go to the gateway's log and
// never to an API caller: PublicMessage puts the reference Ref in their
// place. Error carries the reference too, so that every log line holding
// the engine's words holds it.
type EngineError struct {
	Err error
	Ref string
}

// EngineFailure wraps err, an error the engine's client returned, as an
// EngineError with a new reference; nil stays nil.
func EngineFailure(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*EngineError](err); ok {
		return err
	}
	return &EngineError{Err: err, Ref: fmt.Sprintf("%08x", rand.Uint32())}
}

func (e *EngineError) Error() string { return e.Err.Error() + " [ref " + e.Ref + "]" }

// Unwrap gives the engine's error (errors.Is and As see through).
func (e *EngineError) Unwrap() error { return e.Err }

// PublicMessage is err's text with the engine's words left out: each
// EngineError in it reads "the engine's error is in the gateway's log
// (ref …)". What sandwake itself says (the operation, the sandbox, the
// service, what was wrong with the request) stays. It is the text API
// callers see: answers, a record's error, events.
func PublicMessage(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	for _, e := range engineErrors(err, nil) {
		msg = strings.ReplaceAll(msg, e.Error(), "the engine's error is in the gateway's log (ref "+e.Ref+")")
	}
	return msg
}

// engineErrors appends the EngineErrors in err's tree to out.
func engineErrors(err error, out []*EngineError) []*EngineError {
	switch e := err.(type) {
	case nil:
		return out
	case *EngineError:
		return append(out, e)
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			out = engineErrors(inner, out)
		}
		return out
	case interface{ Unwrap() error }:
		return engineErrors(e.Unwrap(), out)
	}
	return out
}

// logEngineError logs err's engine words, with their references, when it
// holds any: the calls that do not pass through the breaker (which logs
// its own) answer a reference that must be found in the log.
func (m *Manager) logEngineError(op string, err error) {
	if len(engineErrors(err, nil)) > 0 {
		m.log.Warn("engine error", zap.String("op", op), zap.Error(err))
	}
}
