package lifecycle

import (
	"context"
	"errors"
	"fmt"
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
		id, err := m.evictOne(ctx, "", "pressure_"+reason)
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
// with an open connection or a keepalive, never one another operation holds.
func (m *Manager) evictOne(ctx context.Context, exclude, reason string) (string, error) {
	cfg := m.config()
	now := cfg.Now()
	cands, err := m.store.List(func(r *Record) bool {
		return r.ID != exclude && Resident(r.State) && !m.busy(r, now)
	})
	if err != nil {
		return "", err
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
		if err != nil || !Resident(rec.State) || m.busy(&rec, cfg.Now()) {
			unlock()
			continue
		}
		_, err = m.stopLocked(ctx, rec, reason)
		unlock()
		if err != nil {
			m.log.Warn("evicting", zap.String("id", id), zap.Error(err))
			if errors.Is(err, ErrUnavailable) {
				return "", err
			}
			continue
		}
		return id, nil
	}
	return "", fmt.Errorf("%w: every resident sandbox is in use", ErrCapacity)
}
