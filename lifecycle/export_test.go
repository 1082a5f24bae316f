package lifecycle

import (
	"context"
	"time"
)

// This file lends the external tests (package lifecycle_test, which import
// the Badger store and lifecycletest and so cannot be in package lifecycle)
// the internals they check. It is compiled only with the tests.

// Breaker and bus limits.
const (
	BreakerThreshold = breakerThreshold
	BreakerCooldown  = breakerCooldown
	SubscriberBuffer = subscriberBuffer
)

// TransitionTable is the transition table itself.
func TransitionTable() map[State][]State { return allowedFrom }

// SetState records that id is in state s, as the manager does after a
// transition (tests that seed the store directly call it).
func (m *Manager) SetState(id string, s State) { m.setState(id, s) }

// GuardedRuntime is the runtime as the manager calls it: behind the circuit
// breaker.
func (m *Manager) GuardedRuntime() Runtime { return m.runtime }

// LockID takes sandbox id's operation lock and returns its unlock.
func (m *Manager) LockID(id string) (unlock func()) { return m.locks.lock(id) }

// ReapDecision is what the reaper would do with r at now under the current
// settings.
func (m *Manager) ReapDecision(r *Record, now time.Time) (reaper, action string) {
	c := m.config()
	return m.reapDecision(r, &c, now)
}

// ReapOne runs the reaper on one sandbox.
func (m *Manager) ReapOne(ctx context.Context, id string) (reaper, action string, err error) {
	return m.reapOne(ctx, id)
}

// QueuedEvents is how many sandboxes wait in the engine-event queue.
func (m *Manager) QueuedEvents() int { return m.events.len() }

// UnrecordedSettled reports whether no engine change waits to be recorded
// and the retry loop has ended.
func (m *Manager) UnrecordedSettled() bool {
	m.unrecorded.mu.Lock()
	defer m.unrecorded.mu.Unlock()
	return !m.unrecorded.looping && len(m.unrecorded.ids) == 0
}

// PendingCards is how many cards wait for the activity flush.
func (m *Manager) PendingCards() int {
	m.cards.mu.Lock()
	defer m.cards.mu.Unlock()
	n := 0
	for _, byPort := range m.cards.pending {
		n += len(byPort)
	}
	return n
}
