package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// unrecorded holds the sandboxes whose engine change the store refused to
// record (full or unwritable), until a retry loop has re-read each one from
// the engine and recorded it. The loop runs only while the set is not empty.
type unrecorded struct {
	mu      sync.Mutex
	ids     map[string]struct{}
	looping bool
}

// unrecordedError reports an engine change made (the container is done) that
// the store could not record (cause).
func unrecordedError(id, done string, cause error) error {
	return fmt.Errorf("sandbox %s: the container was %s, but the store could not record it (%w); "+
		"it is recorded as soon as the store takes writes again", id, done, cause)
}

// markUnrecorded notes that sandbox id's record may lag the engine because
// the store refused a write, and starts the retry loop if it is not running.
func (m *Manager) markUnrecorded(id string) {
	u := &m.unrecorded
	u.mu.Lock()
	if u.ids == nil {
		u.ids = make(map[string]struct{})
	}
	u.ids[id] = struct{}{}
	start := !u.looping
	u.looping = true
	u.mu.Unlock()
	if !start {
		return
	}
	done, err := m.track("recording engine changes")
	if err != nil {
		u.mu.Lock()
		u.looping = false
		u.mu.Unlock()
		return
	}
	go func() {
		defer done()
		m.recordUnrecorded()
	}()
}

// Unrecorded returns how many sandboxes have an engine change the store has
// not recorded yet.
func (m *Manager) Unrecorded() int {
	m.unrecorded.mu.Lock()
	defer m.unrecorded.mu.Unlock()
	return len(m.unrecorded.ids)
}

// recordUnrecorded checks the store every StoreRetry and, once it takes
// writes, reconciles every sandbox marked unrecorded against a fresh
// inspect. It returns when none is left or the manager closes.
func (m *Manager) recordUnrecorded() {
	u := &m.unrecorded
	t := time.NewTicker(m.cfg.StoreRetry)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			u.mu.Lock()
			u.looping = false
			u.mu.Unlock()
			return
		case <-t.C:
		}
		if err := m.store.Check(); err == nil {
			u.mu.Lock()
			ids := sortedKeys(u.ids)
			clear(u.ids)
			u.mu.Unlock()
			for _, id := range ids {
				m.recordOne(id)
			}
		}
		u.mu.Lock()
		if len(u.ids) == 0 {
			u.looping = false
			u.mu.Unlock()
			return
		}
		u.mu.Unlock()
	}
}

// recordOne reconciles sandbox id; a store that refuses again marks it again
// (through transition), and so does an engine that cannot be asked now.
func (m *Manager) recordOne(id string) {
	ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	defer cancel()
	c, err := m.ReconcileOne(ctx, id)
	switch {
	case err == nil:
		if c == nil {
			m.log.Info("engine change recorded: the record already agreed", zap.String("id", id))
		}
	case errors.Is(err, ErrStoreUnavailable):
		// Refused again: transition marked it again.
	case errors.Is(err, ErrUnavailable):
		m.unrecorded.mu.Lock()
		m.unrecorded.ids[id] = struct{}{}
		m.unrecorded.mu.Unlock()
	default:
		if m.ctx.Err() == nil {
			m.log.Warn("recording an engine change the store refused earlier", zap.String("id", id), zap.Error(err))
		}
	}
}
