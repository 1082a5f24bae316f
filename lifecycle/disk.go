package lifecycle

import (
	"context"
	"errors"
	"sync"

	"go.uber.org/zap"
)

// ReasonDiskQuota is the reason of a sandbox the disk watchdog stopped: it
// wrote more than its disk_mb. A visitor's request does not wake it again;
// an API wake does (and the watchdog stops it again while it is over).
const ReasonDiskQuota = "disk_quota"

// diskUsage remembers the last measure of each sandbox, for the API.
type diskUsage struct {
	mu   sync.Mutex
	used map[string]int64
}

func (d *diskUsage) set(id string, used int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.used == nil {
		d.used = map[string]int64{}
	}
	d.used[id] = used
}

func (d *diskUsage) get(id string) (int64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	used, ok := d.used[id]
	return used, ok
}

func (d *diskUsage) forget(keep map[string]bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := range d.used {
		if !keep[id] {
			delete(d.used, id)
		}
	}
}

// DiskUsed is what sandbox id had written at the watchdog's last measure,
// in bytes; false when it was not measured (no quota, not running, no
// measure yet).
func (m *Manager) DiskUsed(id string) (int64, bool) { return m.disk.get(id) }

// diskPass is the disk watchdog's step: every running or paused sandbox
// with a quota is measured, and one over its quota is stopped with reason
// disk_quota before the engine's disk (and the store on it) fills.
func (m *Manager) diskPass() {
	meter, ok := m.raw.(DiskMeter)
	if !ok {
		return
	}
	n, err := m.DiskCheckOnce(m.ctx, meter)
	if err != nil && m.ctx.Err() == nil {
		m.log.Warn("disk watchdog pass", zap.Error(err), zap.Int("stopped", n))
	}
}

// DiskCheckOnce measures every running or paused sandbox with a disk quota
// and stops those over it; it answers how many it stopped.
func (m *Manager) DiskCheckOnce(ctx context.Context, meter DiskMeter) (stopped int, err error) {
	recs, err := m.residentRecords(func(r *Record) bool {
		return (r.State == Running || r.State == Paused) && r.Spec.DiskMB > 0
	})
	if err != nil {
		return 0, err
	}
	measured := make(map[string]bool, len(recs))
	var errs []error
	for _, rec := range recs {
		if rec.Spec.DiskMB <= 0 || ctx.Err() != nil {
			continue
		}
		used, err := meter.DiskUsage(ctx, rec.ID)
		if err != nil {
			if !errors.Is(err, ErrContainerNotFound) && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		measured[rec.ID] = true
		m.disk.set(rec.ID, used)
		quota := rec.Spec.DiskMB << 20
		if used <= quota {
			continue
		}
		ok, err := m.stopOverQuota(ctx, rec.ID, quota)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			stopped++
			m.log.Warn("sandbox stopped: over its disk quota", zap.String("id", rec.ID), zap.Int64("used_mb", used>>20), zap.Int64("disk_mb", rec.Spec.DiskMB))
			if fn := m.built.OnDiskQuota; fn != nil {
				fn(rec.ID, used, quota)
			}
		}
	}
	m.disk.forget(measured)
	return stopped, errors.Join(errs...)
}

// stopOverQuota stops sandbox id (forced: open exchanges are cut) unless
// something else holds it now (a wake, an API call: the next pass looks
// again) or it is no longer running or paused.
func (m *Manager) stopOverQuota(ctx context.Context, id string, quota int64) (bool, error) {
	done, err := m.track("disk quota stop " + id)
	if err != nil {
		return false, err
	}
	defer done()
	unlock, ok := m.locks.tryLock(id)
	if !ok {
		return false, nil
	}
	defer unlock()
	rec, err := m.store.Get(id)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if rec.State != Running && rec.State != Paused {
		return false, nil
	}
	_, err = m.goDown(id, true, func() (Record, error) { return m.stopLocked(ctx, rec, ReasonDiskQuota) })
	return err == nil, err
}
