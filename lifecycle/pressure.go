package lifecycle

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.uber.org/zap"
)

// memoryHysteresis: once memory pressure is relieved, sandboxes are stopped
// until this much more than MinFreeMemory is available (a tenth), so that the
// next small allocation does not start another round at once.
const memoryHysteresisDiv = 10

// pressureReason says why the host is over its limits now, "" when it is not.
func (m *Manager) pressureReason(cfg *Config) string {
	resident, _ := m.Resident()
	if cfg.MaxResident > 0 && resident > cfg.MaxResident {
		return "resident"
	}
	if cfg.MinFreeMemory > 0 {
		avail, err := cfg.MemAvailable()
		if err != nil {
			m.log.Warn("reading available memory", zap.Error(err))
			return ""
		}
		threshold := cfg.MinFreeMemory
		m.mu.Lock()
		if m.memoryRelief {
			threshold += cfg.MinFreeMemory / memoryHysteresisDiv
		}
		under := avail < threshold
		m.memoryRelief = under
		m.mu.Unlock()
		if under {
			return "memory"
		}
	}
	return ""
}

// relievePressure stops sandboxes, least valuable first, while the host is
// over max_resident or under min_free_memory.
func (m *Manager) relievePressure(ctx context.Context, stats *ReapStats) {
	cfg := m.config()
	for range 10000 {
		reason := m.pressureReason(&cfg)
		if reason == "" || ctx.Err() != nil {
			return
		}
		// Memory pressure is the host's safety: it does not wait for
		// min_resident.
		minResident := cfg.MinResident
		if reason == "memory" {
			minResident = 0
			// The warm pool goes first: it holds no one's work.
			if m.shedPool() {
				continue
			}
		}
		id, _, err := m.evictOne(ctx, "", "pressure_"+reason, minResident)
		if err != nil {
			m.log.Warn("under pressure and nothing can be stopped", zap.String("pressure", reason), zap.Error(err))
			return
		}
		m.log.Info("stopped under pressure", zap.String("id", id), zap.String("pressure", reason))
		stats.count("pressure", ActionStop)
	}
}

// evictOne stops the least valuable resident sandbox other than exclude:
// paused ones before running ones, least recently active first, never one
// with an open connection or a keepalive, never one active (or woken) within
// minResident, never one another operation holds. When none can be stopped
// it fails with ErrCapacity and, when a sandbox is held only by
// minResident, reports when the first of them may be evicted.
func (m *Manager) evictOne(ctx context.Context, exclude, reason string, minResident time.Duration) (string, time.Time, error) {
	cfg := m.config()
	now := cfg.Now()
	var next time.Time
	recent := func(r *Record, now time.Time) bool {
		if minResident <= 0 {
			return false
		}
		until := m.lastActive(r).Add(minResident)
		if !now.Before(until) {
			return false
		}
		if next.IsZero() || until.Before(next) {
			next = until
		}
		return true
	}
	cands, err := m.residentRecords(func(r *Record) bool {
		return r.ID != exclude && Resident(r.State) && !m.busy(r, now) && !recent(r, now)
	})
	if err != nil {
		return "", time.Time{}, err
	}
	last := make(map[string]time.Time, len(cands))
	for i := range cands {
		last[cands[i].ID] = m.lastActive(&cands[i])
	}
	slices.SortFunc(cands, func(a, b Record) int {
		if (a.State == Paused) != (b.State == Paused) {
			if a.State == Paused {
				return -1
			}
			return 1
		}
		return last[a.ID].Compare(last[b.ID])
	})
	for i := range cands {
		id := cands[i].ID
		unlock, ok := m.locks.tryLock(id)
		if !ok {
			continue
		}
		rec, err := m.store.Get(id)
		if err != nil || !Resident(rec.State) || m.busy(&rec, cfg.Now()) || recent(&rec, cfg.Now()) {
			unlock()
			continue
		}
		// Marked as going down only if no request is open on it; one that
		// arrives from here on is held until the sandbox is woken again.
		_, err = m.goDown(id, false, func() (Record, error) { return m.stopLocked(ctx, rec, reason) })
		unlock()
		if errors.Is(err, errInUse) {
			continue
		}
		if err != nil {
			m.log.Warn("evicting", zap.String("id", id), zap.Error(err))
			if errors.Is(err, ErrUnavailable) {
				return "", time.Time{}, err
			}
			continue
		}
		return id, time.Time{}, nil
	}
	return "", next, ErrCapacity
}
