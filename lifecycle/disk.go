package lifecycle

import (
	"context"
	"errors"
	"maps"
	"slices"
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
	// services are the parts of a group's measure each service wrote.
	services map[string]map[string]int64
	// unparted are the groups whose services' own disk_mb could not be
	// enforced (no parts measured), warned of once.
	unparted map[string]bool
}

// warnUnparted reports whether group id is to be warned of (the first time).
func (d *diskUsage) warnUnparted(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.unparted[id] {
		return false
	}
	if d.unparted == nil {
		d.unparted = map[string]bool{}
	}
	d.unparted[id] = true
	return true
}

func (d *diskUsage) set(id string, used int64, services map[string]int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.used == nil {
		d.used = map[string]int64{}
	}
	d.used[id] = used
	if services == nil {
		delete(d.services, id)
		return
	}
	if d.services == nil {
		d.services = map[string]map[string]int64{}
	}
	d.services[id] = services
}

func (d *diskUsage) getServices(id string) map[string]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.services[id] // never written after set: safe to share
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
			delete(d.services, id)
			delete(d.unparted, id)
		}
	}
}

// DiskUsed is what sandbox id had written at the watchdog's last measure,
// in bytes; false when it was not measured (no quota, not running, no
// measure yet).
func (m *Manager) DiskUsed(id string) (int64, bool) { return m.disk.get(id) }

// ServiceDiskUsed is what each service of sandbox id's group had written
// at the watchdog's last measure, in bytes, by service name; nil when it
// was not measured apart (no services, no measure yet, a runtime that
// cannot tell the parts apart). The map must not be changed.
func (m *Manager) ServiceDiskUsed(id string) map[string]int64 { return m.disk.getServices(id) }

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
// (its own disk_mb or a service's) and stops those over it: the whole
// group over the app's disk_mb, or a service over its own. It answers how
// many it stopped.
func (m *Manager) DiskCheckOnce(ctx context.Context, meter DiskMeter) (stopped int, err error) {
	recs, err := m.residentRecords(func(r *Record) bool {
		return (r.State == Running || r.State == Paused) && hasDiskQuota(&r.Spec)
	})
	if err != nil {
		return 0, err
	}
	measured := make(map[string]bool, len(recs))
	var errs []error
	for _, rec := range recs {
		if ctx.Err() != nil {
			break
		}
		var (
			used     int64
			services map[string]int64
		)
		if gm, ok := meter.(GroupDiskMeter); ok && len(rec.Spec.Services) > 0 {
			used, services, err = gm.GroupDiskUsage(ctx, rec.ID)
		} else {
			used, err = meter.DiskUsage(ctx, rec.ID)
		}
		if err != nil {
			if !errors.Is(err, ErrContainerNotFound) && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		measured[rec.ID] = true
		m.disk.set(rec.ID, used, services)
		if services == nil && serviceQuota(rec.Spec.Services) && m.disk.warnUnparted(rec.ID) {
			m.log.Warn("a service's disk_mb is not enforced: the engine's directories of the group cannot be measured apart from here (a remote engine, or a storage driver without an upper directory); the group's whole is still held to the app's disk_mb", zap.String("id", rec.ID))
		}
		over, overUsed, quota := "", used, rec.Spec.DiskMB<<20
		if quota == 0 || used <= quota {
			over = overService(rec.Spec.Services, services)
			if over == "" {
				continue
			}
			overUsed, quota = services[over], rec.Spec.Services[over].DiskMB<<20
		}
		ok, err := m.stopOverQuota(ctx, rec.ID, quota)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			stopped++
			fields := []zap.Field{zap.String("id", rec.ID), zap.Int64("used_mb", overUsed>>20), zap.Int64("disk_mb", quota>>20)}
			if over != "" {
				fields = append(fields, zap.String("service", over))
			}
			m.log.Warn("sandbox stopped: over its disk quota", fields...)
			if fn := m.built.OnDiskQuota; fn != nil {
				fn(rec.ID, overUsed, quota)
			}
		}
	}
	m.disk.forget(measured)
	return stopped, errors.Join(errs...)
}

// hasDiskQuota reports whether the watchdog measures a sandbox: its app or
// one of its services has a disk_mb.
func hasDiskQuota(spec *Spec) bool { return spec.DiskMB > 0 || serviceQuota(spec.Services) }

// serviceQuota reports whether a service has a disk_mb of its own.
func serviceQuota(services map[string]Service) bool {
	for _, svc := range services {
		if svc.DiskMB > 0 {
			return true
		}
	}
	return false
}

// overService names the first service (in name order) that wrote more than
// its own disk_mb, "" when none did or none has one.
func overService(specs map[string]Service, used map[string]int64) string {
	for _, name := range slices.Sorted(maps.Keys(used)) {
		if q := specs[name].DiskMB; q > 0 && used[name] > q<<20 {
			return name
		}
	}
	return ""
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
