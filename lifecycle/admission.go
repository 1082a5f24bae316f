package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// admit reserves room for one more resident sandbox, evicting idle ones to
// make it (see evictOne). When every resident sandbox is in use (open
// requests, a keepalive, active within MinResident), it waits up to
// CapacityWait for room (a sandbox going to sleep, a wake failing, the first
// MinResident lapsing), then fails with ErrCapacity. Reservations count
// wakes in flight, so concurrent wakes never overshoot max_resident. The
// returned function releases the reservation; call it once the sandbox is
// resident (or failed).
func (m *Manager) admit(ctx context.Context, id string) (release func(), err error) {
	cfg := m.config()
	if cfg.MinFreeMemory > 0 {
		if avail, err := cfg.MemAvailable(); err == nil && avail < cfg.MinFreeMemory {
			// The warm pool gives its memory back before any sandbox.
			for avail < cfg.MinFreeMemory && m.shedPool() {
				if avail, err = cfg.MemAvailable(); err != nil {
					break
				}
			}
		}
		if avail, err := cfg.MemAvailable(); err == nil && avail < cfg.MinFreeMemory {
			if _, _, err := m.evictOne(ctx, id, "evicted_memory", 0); err != nil {
				return nil, fmt.Errorf("waking sandbox %s: %w: %d MiB available, %d MiB to keep free", id, ErrCapacity, avail>>20, cfg.MinFreeMemory>>20)
			}
		}
	}
	var waited <-chan time.Time
	for range 20 {
		room := m.roomFreed()
		m.mu.Lock()
		limit := m.cfg.MaxResident
		if limit <= 0 || m.resident+m.reserved < limit {
			m.reserved++
			m.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					m.mu.Lock()
					m.reserved--
					m.freeRoomLocked()
					m.mu.Unlock()
				})
			}, nil
		}
		resident, reserved := m.resident, m.reserved
		m.mu.Unlock()
		_, next, err := m.evictOne(ctx, id, "evicted", cfg.MinResident)
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrCapacity) {
			return nil, fmt.Errorf("waking sandbox %s: making room: %w", id, err)
		}
		if waited == nil {
			if cfg.CapacityWait <= 0 {
				return nil, capacityError(id, limit, resident, reserved, cfg)
			}
			t := time.NewTimer(cfg.CapacityWait)
			defer t.Stop()
			waited = t.C
		}
		var lapse <-chan time.Time
		if !next.IsZero() {
			t := time.NewTimer(max(next.Sub(cfg.Now()), 10*time.Millisecond))
			defer t.Stop()
			lapse = t.C
		}
		select {
		case <-room:
		case <-lapse:
		case <-waited:
			return nil, capacityError(id, limit, resident, reserved, cfg)
		case <-ctx.Done():
			return nil, fmt.Errorf("waking sandbox %s: waiting for room: %w", id, ctx.Err())
		}
	}
	return nil, fmt.Errorf("waking sandbox %s: %w: the room made was taken by other wakes; retry", id, ErrCapacity)
}

// capacityError explains a refused admission.
func capacityError(id string, limit, resident, reserved int, cfg Config) error {
	msg := fmt.Sprintf("all %d places of max_resident are taken (%d sandboxes running or paused, %d waking) and each is in use", limit, resident, reserved)
	if cfg.MinResident > 0 {
		msg += fmt.Sprintf(" or was active in the last %s (min_resident)", cfg.MinResident)
	}
	if cfg.CapacityWait > 0 {
		msg += fmt.Sprintf("; waited %s for room", cfg.CapacityWait)
	}
	return fmt.Errorf("waking sandbox %s: %w: %s; retry later", id, ErrCapacity, msg)
}

// roomFreed returns a channel closed the next time a resident place is freed
// (a sandbox leaves running or paused, a reservation is released).
func (m *Manager) roomFreed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.room == nil {
		m.room = make(chan struct{})
	}
	return m.room
}

// freeRoomLocked wakes the admissions waiting for room; m.mu is held.
func (m *Manager) freeRoomLocked() {
	if m.room != nil {
		close(m.room)
		m.room = nil
	}
}
