package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// Pause freezes running sandbox id. Pausing a paused sandbox is a no-op;
// any other state is ErrConflict.
func (m *Manager) Pause(ctx context.Context, id, reason string) (Record, error) {
	return m.forceDown(id, func(rec Record) (Record, error) { return m.pauseLocked(ctx, rec, reason) })
}

// forceDown runs op (a pause or stop the API asked for) on sandbox id's
// record, under its lock, with the sandbox marked as going down whatever is
// open (see goDown).
func (m *Manager) forceDown(id string, op func(Record) (Record, error)) (Record, error) {
	done, err := m.track("stop " + id)
	if err != nil {
		return Record{}, err
	}
	defer done()
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.Get(id)
	if err != nil {
		return Record{}, err
	}
	return m.goDown(id, true, func() (Record, error) { return op(rec) })
}

// pauseLocked pauses rec's sandbox; the caller holds its lock.
func (m *Manager) pauseLocked(ctx context.Context, rec Record, reason string) (Record, error) {
	switch rec.State {
	case Paused:
		return rec, nil
	case Running:
	default:
		return Record{}, fmt.Errorf("pausing sandbox %s: %w: it is %s", rec.ID, ErrConflict, rec.State)
	}
	if !m.canPause() {
		return Record{}, fmt.Errorf("pausing sandbox %s: %w", rec.ID, ErrPauseUnsupported)
	}
	if err := m.runtime.Pause(ctx, rec.ID); err != nil {
		return Record{}, fmt.Errorf("pausing sandbox %s: %w", rec.ID, err)
	}
	out, err := m.transition(rec.ID, Paused, reason, func(r *Record) error {
		r.VerifiedAt = m.cfg.Now().UTC()
		return nil
	})
	if errors.Is(err, ErrStoreUnavailable) {
		return Record{}, unrecordedError(rec.ID, "paused", err)
	}
	return out, err
}

// Stop stops running or paused sandbox id, keeping its container and volume.
// Stopping a stopped sandbox is a no-op; any other state is ErrConflict.
func (m *Manager) Stop(ctx context.Context, id, reason string) (Record, error) {
	return m.forceDown(id, func(rec Record) (Record, error) { return m.stopLocked(ctx, rec, reason) })
}

// goDown runs op, a pause, stop or expiry of sandbox id under its lock, with
// the sandbox marked as going down, so that no request is sent to it
// meanwhile (see Activity). Unless force, it backs off with errInUse when an
// exchange is open. A forced one (the API, expiry) cuts open exchanges.
func (m *Manager) goDown(id string, force bool, op func() (Record, error)) (Record, error) {
	a := m.activity.get(id)
	if !a.beginDown(force) {
		return Record{}, errInUse
	}
	defer a.endDown()
	rec, err := op()
	if err != nil {
		// Routes read while it was going down are stale (Downs moved on)
		// though the record did not change: have them read again.
		m.changed(id)
	}
	return rec, err
}

// stopLocked stops rec's sandbox; the caller holds its lock.
func (m *Manager) stopLocked(ctx context.Context, rec Record, reason string) (Record, error) {
	switch rec.State {
	case Stopped:
		return rec, nil
	case Running, Paused:
	default:
		return Record{}, fmt.Errorf("stopping sandbox %s: %w: it is %s", rec.ID, ErrConflict, rec.State)
	}
	if err := m.runtime.Stop(ctx, rec.ID); err != nil && !errors.Is(err, ErrContainerNotFound) {
		return Record{}, fmt.Errorf("stopping sandbox %s: %w", rec.ID, err)
	}
	m.unbindPort(rec.ID, rec.Address) // its port went with the container's network
	out, err := m.transition(rec.ID, Stopped, reason, func(r *Record) error {
		now := m.cfg.Now().UTC()
		r.StoppedAt = now
		r.VerifiedAt = now
		return nil
	})
	if errors.Is(err, ErrStoreUnavailable) {
		return Record{}, unrecordedError(rec.ID, "stopped", err)
	}
	return out, err
}

// expireLocked removes rec's container at the end of its lifetime, keeping
// the volume; the caller holds its lock.
func (m *Manager) expireLocked(ctx context.Context, rec Record) (Record, error) {
	if err := m.runtime.Remove(ctx, rec.ID); err != nil {
		return Record{}, fmt.Errorf("expiring sandbox %s: %w", rec.ID, err)
	}
	m.unbindPort(rec.ID, rec.Address)
	return m.transition(rec.ID, Expired, "max_lifetime", func(r *Record) error {
		r.ContainerID = ""
		r.Upstreams = nil
		r.VerifiedAt = m.cfg.Now().UTC()
		return nil
	})
}

// Keepalive keeps sandbox id from idling out for d (capped at KeepaliveMax)
// and counts as activity.
func (m *Manager) Keepalive(id string, d time.Duration) (Record, error) {
	if d <= 0 {
		return Record{}, invalid("keepalive duration %s must be positive", d)
	}
	_, keepaliveMax := m.limits()
	d = min(d, keepaliveMax)
	now := m.cfg.Now().UTC()
	return m.store.Update(id, func(r *Record) error {
		r.KeepaliveUntil = now.Add(d)
		r.LastActiveAt = now
		return nil
	})
}

// Patch is a change of a sandbox's settings (nil fields stay as they are).
type Patch struct {
	Access      *string
	PublicCard  *bool
	IdlePause   *time.Duration
	IdleStop    *time.Duration
	MaxLifetime *time.Duration
	// Egress replaces the sandbox's egress policy; on a running sandbox it
	// is in force when Update returns, and connections it forbids are cut
	// at their next packet.
	Egress *Egress
}

// Update changes sandbox id's settings. A new max_lifetime counts from the
// sandbox's creation; a change of access revokes every preview token.
func (m *Manager) Update(id string, p Patch) (Record, error) {
	if p.Access != nil && *p.Access != AccessPublic && *p.Access != AccessPrivate {
		return Record{}, invalid("access: %q is not public or private", *p.Access)
	}
	if err := checkTiers(p.IdlePause, p.IdleStop, p.MaxLifetime); err != nil {
		return Record{}, err
	}
	if p.Egress != nil {
		if err := NormalizeEgress(p.Egress, m.built.Egress, m.deniedRanges()); err != nil {
			return Record{}, err
		}
		if err := m.checkRuntimeEgress(*p.Egress); err != nil {
			return Record{}, err
		}
	}
	unlock := m.locks.lock(id)
	defer unlock()
	defer m.firewallShared()()
	rec, err := m.store.Update(id, func(r *Record) error {
		if p.Access != nil {
			if *p.Access != effectiveAccess(r.Spec.Access) {
				// Tokens given out under one access level do not carry
				// over to the next: a sandbox made private again is
				// closed to every token minted before.
				r.TokenGeneration++
			}
			r.Spec.Access = *p.Access
		}
		if p.PublicCard != nil {
			r.Spec.PublicCard = *p.PublicCard
		}
		if p.IdlePause != nil {
			r.Spec.IdlePause = p.IdlePause
		}
		if p.IdleStop != nil {
			r.Spec.IdleStop = p.IdleStop
		}
		if p.MaxLifetime != nil {
			r.Spec.MaxLifetime = p.MaxLifetime
			r.ExpiresAt = time.Time{}
			if *p.MaxLifetime > 0 {
				r.ExpiresAt = r.CreatedAt.Add(*p.MaxLifetime)
			}
		}
		if p.Egress != nil {
			r.Spec.Egress = *p.Egress
			if p.Egress.Policy != EgressLearn {
				r.EgressLearned = nil // locked, or given a policy by hand
			}
		}
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	if p.Egress != nil {
		// Stored first: should the kernel refuse, the next firewall sync
		// installs what the record says.
		if err := m.applyEgress(&rec); err != nil {
			return Record{}, fmt.Errorf("updating sandbox %s: %w", id, err)
		}
		if err := m.applyRuntimeEgress(&rec); err != nil {
			return Record{}, fmt.Errorf("updating sandbox %s: %w", id, err)
		}
		// Watchers and webhooks learn of it as of any change that matters.
		if _, err := m.store.AppendEvent(Event{Type: EventEgress, SandboxID: id, Reason: rec.Spec.Egress.Policy, Incarnation: rec.Incarnation, Labels: rec.Spec.Labels}); err != nil {
			m.log.Warn("recording the egress change", zap.String("id", id), zap.Error(err))
		}
	}
	m.changed(id)
	return rec, nil
}

// effectiveAccess is a stored access level, "" (records made before access
// levels) being public.
func effectiveAccess(a string) string {
	if a == "" {
		return AccessPublic
	}
	return a
}

// RotateTokens revokes every preview token of sandbox id by moving to a new
// token generation.
func (m *Manager) RotateTokens(id string) (Record, error) {
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.Update(id, func(r *Record) error {
		r.TokenGeneration++
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	m.changed(id)
	return rec, nil
}

// Destroy removes sandbox id's container and record. The volume is kept (see
// Purge). A transient engine error leaves everything as it was.
func (m *Manager) Destroy(ctx context.Context, id, reason string) error {
	done, err := m.track("destroy " + id)
	if err != nil {
		return err
	}
	defer done()
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.Get(id)
	if err != nil {
		return err
	}
	if err := m.runtime.Remove(ctx, id); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", id, err)
	}
	m.unbindPort(id, rec.Address)
	defer m.firewallShared()()
	if _, err := m.store.Delete(id, EventDestroyed, reason); err != nil {
		if errors.Is(err, ErrStoreUnavailable) {
			// Reconcile can only record the container as missing
			// (killed): the deletion itself needs the DELETE again.
			return fmt.Errorf("sandbox %s: the container was removed, but the store could not delete the record (%w); "+
				"send the DELETE again once the store takes writes", id, err)
		}
		return err
	}
	m.setState(id, "")
	m.activity.m.Delete(id)
	m.forgetAddress(id, rec.Address)
	return nil
}

// Purge removes sandbox id's container, volume and record and reports the
// bytes the volume held. It also purges the volume of a sandbox destroyed
// earlier; ErrNotFound when there is neither record nor volume.
func (m *Manager) Purge(ctx context.Context, id, reason string) (freed int64, err error) {
	done, err := m.track("purge " + id)
	if err != nil {
		return 0, err
	}
	defer done()
	if !ValidID(id) {
		return 0, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	unlock := m.locks.lock(id)
	defer unlock()
	rec, err := m.store.Get(id)
	hasRecord := err == nil
	if err != nil && !errors.Is(err, ErrNotFound) {
		return 0, err
	}
	// Without a record only the volume of a sandbox destroyed earlier is
	// purged (the runtime removes nothing that is not this instance's).
	if hasRecord {
		if err := m.runtime.Remove(ctx, id); err != nil {
			return 0, fmt.Errorf("purging sandbox %s: %w", id, err)
		}
		m.unbindPort(id, rec.Address)
	}
	freed, err = m.runtime.RemoveVolume(ctx, id)
	if errors.Is(err, ErrNotFound) {
		if !hasRecord {
			return 0, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
		}
		err = nil // the record's volume was already gone
	}
	if err != nil {
		return 0, fmt.Errorf("purging sandbox %s: %w", id, err)
	}
	if hasRecord {
		fwDone := m.firewallShared()
		defer fwDone()
		if _, err = m.store.Delete(id, EventPurged, reason); err == nil {
			m.setState(id, "")
			m.activity.m.Delete(id)
			m.forgetAddress(id, rec.Address)
		}
	} else {
		_, err = m.store.PurgeVolume(Event{Type: EventPurged, SandboxID: id, Reason: reason})
	}
	return freed, err
}
