package lifecycle

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// Reaper actions, as counted in ReapStats and metrics.
const (
	ActionPause  = "pause"
	ActionStop   = "stop"
	ActionExpire = "expire"
)

// ReapStats counts what one reaper pass did.
type ReapStats struct {
	// Scanned is the number of records looked at.
	Scanned int
	// Actions counts actions taken, by reaper ("idle", "expiry",
	// "pressure") and action (pause, stop, expire).
	Actions map[string]map[string]int
	// Errors counts actions that failed.
	Errors int
}

func (s *ReapStats) count(reaper, action string) {
	if s.Actions == nil {
		s.Actions = map[string]map[string]int{}
	}
	if s.Actions[reaper] == nil {
		s.Actions[reaper] = map[string]int{}
	}
	s.Actions[reaper][action]++
}

// Total is the number of actions taken.
func (s *ReapStats) Total() int {
	n := 0
	for _, byAction := range s.Actions {
		for _, c := range byAction {
			n += c
		}
	}
	return n
}

// lastActive is the most recent activity of a sandbox: the stored time or
// what the request path saw since the last flush.
func (m *Manager) lastActive(r *Record) time.Time {
	t := r.LastActiveAt
	if a := m.activity.get(r.ID).LastActive(); a.After(t) {
		t = a
	}
	return t
}

// busy reports whether a sandbox must not be put to sleep: it has an open
// proxied exchange or a keepalive in the future.
func (m *Manager) busy(r *Record, now time.Time) bool {
	return m.activity.get(r.ID).OpenConnections() > 0 || r.KeepaliveUntil.After(now)
}

func durationOr(override *time.Duration, global time.Duration) time.Duration {
	if override != nil {
		return *override
	}
	return global
}

// expiry is when a sandbox with lifetime life expires: its lifetime counts
// from creation, or from its last recreation after expiring (ExpiresAt).
func expiry(r *Record, life time.Duration) time.Time {
	deadline := r.CreatedAt.Add(life)
	if r.ExpiresAt.After(deadline) {
		deadline = r.ExpiresAt
	}
	return deadline
}

// reapDecision is what the reaper would do to one record now.
func (m *Manager) reapDecision(r *Record, cfg *Config, now time.Time) (reaper, action string) {
	if life := durationOr(r.Spec.MaxLifetime, cfg.MaxLifetime); life > 0 && !now.Before(expiry(r, life)) {
		switch r.State {
		case Running, Paused, Stopped, Killed, Error:
			return "expiry", ActionExpire
		}
	}
	if r.State != Running && r.State != Paused {
		return "", ""
	}
	if m.busy(r, now) {
		return "", ""
	}
	idle := now.Sub(m.lastActive(r))
	if idle > 0 && m.activityOf(r, cfg) == ActivityAny {
		idle = m.outboundIdle(r, cfg, now, idle)
	}
	if stop := durationOr(r.Spec.IdleStop, cfg.IdleStop); stop > 0 && idle >= stop {
		return "idle", ActionStop
	}
	if pause := durationOr(r.Spec.IdlePause, cfg.IdlePause); r.State == Running && pause > 0 && idle >= pause {
		if !m.canPause() {
			m.pauseCollapsed.Do(func() {
				m.log.Info("the container engine cannot pause sandboxes: a sandbox idle for its idle_pause is stopped instead")
			})
			return "idle", ActionStop
		}
		return "idle", ActionPause
	}
	return "", ""
}

// fullReapEvery is how often the reaper loop's pass reads every record
// (expiry of sandboxes that are not running or paused); the passes between
// read the running and paused sandboxes alone, whose idle tiers and expiry
// they decide as a full pass would. At 1,000,000 records a full pass takes
// seconds; a resident one costs the few hundred sandboxes max_resident lets
// be running or paused.
const fullReapEvery = 6

// ReapOnce runs one pass of the idle tiers and expiry over every record, then
// relieves memory and residency pressure. Each candidate is decided again
// under its lock just before acting, so a request that arrived after the scan
// wins.
func (m *Manager) ReapOnce(ctx context.Context) (ReapStats, error) {
	return m.reap(ctx, true)
}

// ReapResidentOnce is ReapOnce over the running and paused sandboxes only,
// the pass the reaper loop runs between its full ones: idle tiers and
// expiry of those sandboxes, then pressure, without reading the others.
func (m *Manager) ReapResidentOnce(ctx context.Context) (ReapStats, error) {
	return m.reap(ctx, false)
}

// reap is a reaper pass: over every record (full), or over the running and
// paused sandboxes only.
func (m *Manager) reap(ctx context.Context, full bool) (ReapStats, error) {
	var stats ReapStats
	cfg := m.config()
	now := cfg.Now()
	var candidates []string
	due := func(r *Record) bool {
		stats.Scanned++
		_, action := m.reapDecision(r, &cfg, now)
		return action != ""
	}
	var (
		recs []Record
		err  error
	)
	if full {
		recs, err = m.store.List(due)
	} else {
		recs, err = m.residentRecords(due)
	}
	if err != nil {
		return stats, err
	}
	for i := range recs {
		candidates = append(candidates, recs[i].ID)
	}
	for _, id := range candidates {
		if ctx.Err() != nil {
			return stats, ctx.Err()
		}
		reaper, action, err := m.reapOne(ctx, id)
		switch {
		case err != nil:
			stats.Errors++
			m.log.Warn("reaper", zap.String("id", id), zap.String("action", action), zap.Error(err))
		case action != "":
			stats.count(reaper, action)
		}
	}
	m.relievePressure(ctx, &stats)
	return stats, nil
}

// reapOne re-decides and acts on one sandbox under its lock.
func (m *Manager) reapOne(ctx context.Context, id string) (reaper, action string, err error) {
	done, err := m.track("reap " + id)
	if err != nil {
		return "", "", err
	}
	defer done()
	unlock, ok := m.locks.tryLock(id)
	if !ok {
		return "", "", nil // a wake or an API call is on it: not idle
	}
	defer unlock()
	rec, err := m.store.Get(id)
	if errors.Is(err, ErrNotFound) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	cfg := m.config()
	reaper, action = m.reapDecision(&rec, &cfg, cfg.Now())
	switch action {
	case ActionPause:
		_, err = m.goDown(id, false, func() (Record, error) {
			out, err := m.pauseLocked(ctx, rec, "idle")
			if errors.Is(err, ErrPauseUnsupported) {
				// The runtime cannot pause this one sandbox (Pauser): its
				// idle tiers collapse to a stop.
				action = ActionStop
				return m.stopLocked(ctx, rec, "idle")
			}
			return out, err
		})
	case ActionStop:
		_, err = m.goDown(id, false, func() (Record, error) { return m.stopLocked(ctx, rec, "idle") })
	case ActionExpire:
		_, err = m.goDown(id, true, func() (Record, error) { return m.expireLocked(ctx, rec) })
	}
	if errors.Is(err, errInUse) {
		return "", "", nil // a request came first: not idle
	}
	return reaper, action, err
}

// reapPass is the reaper loop's step: a pass (every fullReapEvery-th over
// every record, the first included; the others over the running and paused
// sandboxes), then event-log pruning.
func (m *Manager) reapPass() {
	m.mu.Lock()
	full := m.reapPasses%fullReapEvery == 0
	m.reapPasses++
	m.mu.Unlock()
	stats, err := m.reap(m.ctx, full)
	if err != nil && m.ctx.Err() == nil {
		m.log.Warn("reaper pass", zap.Error(err))
	}
	if fn := m.built.OnReap; fn != nil {
		fn(stats)
	}
	if cfg := m.config(); cfg.EventRetention > 0 {
		if n, err := m.store.PruneEvents(cfg.Now().Add(-cfg.EventRetention)); err != nil {
			m.log.Warn("pruning events", zap.Error(err))
		} else if n > 0 {
			m.log.Info("pruned old events", zap.Int("events", n), zap.Duration("retention", cfg.EventRetention))
		}
	}
}
