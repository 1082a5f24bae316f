package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
)

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	// ID is the sandbox id; empty means a new lowercase ULID. Upper case is
	// folded to lower case.
	ID   string
	Spec Spec
	// Template, when set, names the template the sandbox is made from;
	// Spec then holds only the caller's own fields (see fromTemplate).
	Template string
	// Pool is what a create from a template does with its warm pool:
	// PoolPrefer (""), PoolRequire or PoolBypass.
	Pool string
	// Reserve, when set, is called with the sandbox's id once it is
	// known and before anything is made: a create without an id learns
	// it from the pool container it claims, or draws one. An error ends
	// the create (a claimed container goes back to the pool). A cluster
	// reserves the id cluster-wide with it.
	Reserve func(id string) error
	// Release, when set, is called with an id Reserve took for a pool
	// container whose claim failed (the create goes on cold, or fails).
	Release func(id string)
	// Tenant is the caller's label selector (a tenant's token); nil for
	// an unscoped caller. A bound caller may not create an id whose kept
	// workspace volume another tenant's record made (see takeVolume).
	Tenant map[string]string
}

// Create validates req, stores the sandbox as creating, creates and starts its
// container and waits for readiness. It returns the running record, or an
// error with the record left in error (the record is kept so the failure can
// be read and the sandbox retried with Wake). The work runs on the manager's
// context bounded by WakeTimeout: a caller that gives up does not leave a
// half-made sandbox. A create from a template claims an idle container of
// its warm pool when it can (see CreatePooled).
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Record, error) {
	rec, _, err := m.CreatePooled(ctx, req)
	return rec, err
}

// CreatePooled is Create that also reports what the template's warm pool
// did: a claim (Hit) or, for a cold create, why not.
func (m *Manager) CreatePooled(ctx context.Context, req CreateRequest) (Record, PoolOutcome, error) {
	done, err := m.track("create " + req.ID)
	if err != nil {
		return Record{}, PoolOutcome{}, err
	}
	defer done()
	if req.Template == "" {
		if req.Pool != "" {
			return Record{}, PoolOutcome{}, invalid("pool: %q needs a template", req.Pool)
		}
		rec, err := m.createCold(ctx, req.ID, req.Spec, "", req.Reserve, req.Tenant)
		return rec, PoolOutcome{}, err
	}
	t, ok := m.Template(req.Template)
	if !ok {
		return Record{}, PoolOutcome{}, invalid("template %q is not configured here (templates: %s)", req.Template, templateNames(m.config().Templates))
	}
	mode := req.Pool
	switch mode {
	case "":
		mode = PoolPrefer
	case PoolPrefer, PoolRequire, PoolBypass:
	default:
		return Record{}, PoolOutcome{}, invalid("pool: %q is not prefer, require or bypass", req.Pool)
	}
	spec, err := fromTemplate(&t, &req.Spec, mode)
	if err != nil {
		return Record{}, PoolOutcome{}, err
	}
	reason := ""
	switch {
	case mode == PoolBypass:
		reason = PoolMissBypass
	case req.ID != "":
		reason = PoolMissID
	case len(req.Spec.Env) > 0:
		reason = PoolMissEnv
	case t.Pool.MaxIdle == 0:
		reason = PoolMissNone
	}
	if reason == "" {
		checked := spec
		if err := m.checkSpec(&checked); err != nil {
			return Record{}, PoolOutcome{}, err
		}
		reason = PoolMissEmpty
		if s := m.pool.take(t.Name); s != nil {
			if req.Reserve != nil {
				if err := req.Reserve(s.id); err != nil {
					m.putBack(t.Name, s)
					m.pool.done(s.id)
					return Record{}, PoolOutcome{}, err
				}
			}
			start := m.cfg.Now()
			rec, admitted, err := m.claim(s, &t, checked)
			if err != nil && req.Release != nil {
				req.Release(s.id) // a failed claim leaves no record of it
			}
			if !admitted {
				m.putBack(t.Name, s) // untouched: after the release, so that it can be claimed again
			}
			m.pool.done(s.id)
			m.pool.poke()
			if err == nil {
				out := PoolOutcome{Hit: true}
				m.pool.count(t.Name, true, "")
				if m.cfg.OnPoolClaim != nil {
					m.cfg.OnPoolClaim(t.Name, out, m.cfg.Now().Sub(start))
				}
				return rec, out, nil
			}
			if errors.Is(err, ErrCapacity) || errors.Is(err, ErrClosed) || errors.Is(err, ErrStoreUnavailable) {
				return Record{}, PoolOutcome{}, err
			}
			m.log.Warn("claiming a pool container failed; creating cold", zap.String("template", t.Name), zap.Error(err))
			reason = PoolMissFailed
		}
	}
	out := PoolOutcome{Reason: reason}
	m.pool.count(t.Name, false, reason)
	m.pool.poke()
	if m.cfg.OnPoolClaim != nil {
		m.cfg.OnPoolClaim(t.Name, out, 0)
	}
	if mode == PoolRequire {
		return Record{}, out, fmt.Errorf("%w: template %s: no idle pool container could be claimed (%s); retry, or create without \"pool\":\"require\"", ErrPoolEmpty, t.Name, reason)
	}
	rec, err := m.createCold(ctx, req.ID, spec, t.Name, req.Reserve, req.Tenant)
	return rec, out, err
}

// createCold makes a sandbox's container from nothing (see Create).
func (m *Manager) createCold(ctx context.Context, reqID string, spec Spec, template string, reserve func(string) error, tenant map[string]string) (Record, error) {
	id := reqID
	if id == "" {
		id = NewID(m.cfg.Now())
		if reserve != nil {
			if err := reserve(id); err != nil {
				return Record{}, err
			}
		}
	}
	// Fold only ASCII: strings.ToLower would turn the Kelvin sign into k.
	if !ValidID(asciiLower(id)) {
		return Record{}, invalid("id %q must be 1-%d characters of [0-9a-z]", reqID, MaxIDLen)
	}
	id = asciiLower(id)
	if err := m.checkSpec(&spec); err != nil {
		return Record{}, err
	}
	// An image that cannot be had is refused before anything is written.
	if ic, ok := m.raw.(ImageChecker); ok {
		wakeTimeout, _ := m.limits()
		ictx, cancel := context.WithTimeout(m.ctx, wakeTimeout)
		err := ic.CheckImage(ictx, spec.Image)
		for _, name := range slices.Sorted(maps.Keys(spec.Services)) {
			if err == nil {
				if err = ic.CheckImage(ictx, spec.Services[name].Image); err != nil {
					err = fmt.Errorf("service %s: %w", name, err)
				}
			}
		}
		cancel()
		m.logEngineError("checking the image of sandbox "+id, err)
		if err != nil {
			return Record{}, fmt.Errorf("creating sandbox %s: %w", id, err)
		}
	}
	// A taken id is refused before admission, which may evict a sandbox
	// to make room. (Store.Create checks again, under the lock.)
	if _, err := m.store.Get(id); err == nil {
		return Record{}, fmt.Errorf("creating sandbox %s: %w", id, ErrExists)
	}
	release, err := m.admit(m.ctx, id)
	if err != nil {
		return Record{}, err
	}
	defer release()

	unlock := m.locks.lock(id)
	defer unlock()
	wakeTimeout, _ := m.limits()
	wctx, cancel := context.WithTimeout(m.ctx, wakeTimeout)
	defer cancel()
	// A sandbox whose policy cannot be enforced is not made at all.
	if err := m.egressReady(wctx); err != nil {
		return Record{}, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	// The id's past belongs to the tenant whose record made its kept
	// volume: checked under the id's lock, which destroy and purge take.
	freshVolume, err := m.takeVolume(wctx, id, tenant)
	if err != nil {
		return Record{}, err
	}
	addr, err := m.allocate(wctx, id)
	if err != nil {
		return Record{}, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	now := m.cfg.Now().UTC()
	rec := Record{ID: id, Spec: spec, State: Creating, CreatedAt: now, LastActiveAt: now, StateSince: now, Incarnation: NewIncarnation(), Address: addr, Template: template}
	if life := durationOr(spec.MaxLifetime, m.config().MaxLifetime); life > 0 {
		rec.ExpiresAt = now.Add(life)
	}
	fwDone := m.firewallShared()
	if _, _, err := m.store.Create(rec, "create"); err != nil {
		fwDone()
		m.release(id, addr)
		if errors.Is(err, ErrStoreUnavailable) {
			// The write may have landed all the same: read it again once
			// the store takes writes (a record left creating becomes
			// error).
			m.markUnrecorded(id)
		}
		return Record{}, err
	}
	m.setState(id, Creating)
	// The rules exist before the container does: its first packet meets
	// them.
	if err := m.applyEgress(&rec); err != nil {
		fwDone()
		m.discard(id, addr, err)
		return Record{}, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	fwDone()
	spec.Address, spec.Incarnation = addr, rec.Incarnation
	c, err := m.runtime.Create(wctx, id, spec)
	made := err == nil
	if made && freshVolume {
		m.recordOwner(&rec)
	}
	if err == nil {
		c, err = m.startBound(wctx, id, addr)
	}
	if err == nil {
		err = m.waitReady(wctx, id, &spec, c.Upstreams)
	}
	if err != nil && (errors.Is(err, ErrIDTaken) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrImageNotFound)) {
		// Nothing is left (what a start refused, such as a pod whose image
		// no node has, is removed, and its volume when this create made
		// it): the id stays free and no record is left of a sandbox that
		// never existed.
		if made {
			m.unmake(id, freshVolume)
		}
		m.discard(id, addr, err)
		return Record{}, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	if err != nil {
		// Whatever the cause, a failed create leaves creating: a record
		// stuck there could be neither woken nor retried.
		m.fail(id, err, true)
		return Record{}, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	return m.transition(id, Running, "create", func(r *Record) error {
		m.adopt(r, c)
		return nil
	})
}

// checkSpec normalises spec and checks it against this host and the
// operator's policy: everything Docker would refuse is refused here, before
// anything is written.
func (m *Manager) checkSpec(spec *Spec) error {
	if err := NormalizeSpec(spec); err != nil {
		return err
	}
	cfg := m.config()
	if spec.MemoryMB == 0 {
		spec.MemoryMB = cfg.DefaultMemoryMB
	}
	if err := normalizeIsolation(spec, cfg.Isolation); err != nil {
		return err
	}
	if err := normalizeServices(spec, &cfg); err != nil {
		return err
	}
	if cfg.HostCPUs > 0 && spec.CPUs > float64(cfg.HostCPUs) {
		return invalid("cpus: %g is more than the host's %d CPUs", spec.CPUs, cfg.HostCPUs)
	}
	if cfg.HostMemoryMB > 0 && spec.MemoryMB > cfg.HostMemoryMB {
		return invalid("memory_mb: %d is more than the host's %d MiB", spec.MemoryMB, cfg.HostMemoryMB)
	}
	if len(cfg.AllowedImages) > 0 && !ImageAllowed(cfg.AllowedImages, spec.Image) {
		return invalid("image %q is not allowed here (allowed_images: %s)", spec.Image, strings.Join(cfg.AllowedImages, " "))
	}
	if spec.Egress.Allow == nil && spec.Egress.Deny == nil && len(m.built.Egress.DefaultAllow) > 0 {
		// egress_allow is a default for what a create leaves out, not a
		// floor: a PATCH, a lock or a create naming a list replaces it.
		spec.Egress.Allow = slices.Clone(m.built.Egress.DefaultAllow)
	}
	if err := NormalizeEgress(&spec.Egress, m.built.Egress, m.deniedRanges()); err != nil {
		return err
	}
	return m.checkRuntimeEgress(spec.Egress)
}

// discard removes the record of a create that made nothing, and its
// address and firewall entry.
func (m *Manager) discard(id string, addr netip.Addr, cause error) {
	defer m.firewallShared()()
	if _, err := m.store.Delete(id, EventDestroyed, "create_refused"); err != nil {
		m.log.Error("removing the record of a refused create", zap.String("id", id), zap.Error(err), zap.NamedError("cause", cause))
		return
	}
	m.setState(id, "")
	m.forgetAddress(id, addr)
	m.log.Info("create refused", zap.String("id", id), zap.Error(cause))
}

// unmake removes what a refused create made of sandbox id: its
// container, and its volume when fresh.
func (m *Manager) unmake(id string, fresh bool) {
	ctx, cancel := context.WithTimeout(m.ctx, time.Minute)
	defer cancel()
	err := m.runtime.Remove(ctx, id)
	if err == nil && fresh {
		_, err = m.runtime.RemoveVolume(ctx, id)
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		m.log.Warn("removing what a refused create made", zap.String("id", id), zap.Error(err))
	}
}

// adopt copies what the engine reported of a running container into r.
func (m *Manager) adopt(r *Record, c Container) {
	now := m.cfg.Now().UTC()
	r.ContainerID = c.ID
	r.Upstreams = c.Upstreams
	r.PublishedPorts = c.Published
	r.DNSForwarded = c.DNSForwarded
	if c.Members != nil {
		r.ServiceStates = c.Members
	}
	r.Error = ""
	r.VerifiedAt = now
	r.LastActiveAt = now
}

// waitReady waits for the sandbox's first declared port. Meanwhile it
// watches the container: one that exits while its app should be coming up
// (a bad command, a crash at start) fails the wake at once with its exit
// code instead of after wake_timeout.
func (m *Manager) waitReady(ctx context.Context, id string, spec *Spec, upstreams map[int]string) error {
	addr, ok := upstreams[spec.Ports[0]]
	if !ok {
		// Docker reports no port for a container that already exited.
		if c, err := m.runtime.Inspect(ctx, id); err == nil && (c.State == ContainerExited || c.State == ContainerDead) {
			return fmt.Errorf("%w: the container exited with code %d while starting", ErrNotReady, c.ExitCode)
		}
		return fmt.Errorf("sandbox %s: no upstream for port %d", id, spec.Ports[0])
	}
	ctx, cancel := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	defer func() {
		cancel(nil)
		<-watched
	}()
	go func() {
		defer close(watched)
		t := time.NewTicker(exitWatch)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c, err := m.runtime.Inspect(ctx, id)
				if err == nil && (c.State == ContainerExited || c.State == ContainerDead) {
					cause := fmt.Errorf("%w: the container exited with code %d while starting", ErrNotReady, c.ExitCode)
					if c.OOMKilled {
						cause = fmt.Errorf("%w: the container ran out of memory while starting", ErrNotReady)
					}
					cancel(cause)
					return
				}
			}
		}
	}()
	err := WaitReadyAt(ctx, addr, spec, m.direct())
	if err != nil && context.Cause(ctx) != nil && !errors.Is(context.Cause(ctx), context.Canceled) && !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return context.Cause(ctx)
	}
	return err
}

// exitWatch is how often a starting container is checked for an early exit.
const exitWatch = 500 * time.Millisecond

// fail records a failed create or wake as state error. A failed wake whose
// cause was a transient engine error or the manager shutting down leaves the
// record as it was; a failed create (always) goes to error.
func (m *Manager) fail(id string, cause error, creating bool) {
	if !creating && (errors.Is(cause, ErrUnavailable) || m.ctx.Err() != nil) {
		return
	}
	// The record's error is read through the API: the engine's own words
	// (host paths, driver ids) go to the log, the record keeps their
	// reference.
	msg := PublicMessage(cause)
	m.log.Warn("sandbox failed", zap.String("id", id), zap.Bool("creating", creating), zap.Error(cause))
	_, err := m.transition(id, Error, reasonOf(cause), func(r *Record) error {
		r.Error = msg
		return nil
	})
	if err != nil {
		m.log.Error("recording failure", zap.String("id", id), zap.Error(err), zap.NamedError("cause", cause))
	}
	var se *ServiceError
	if errors.As(cause, &se) {
		if rec, err := m.store.Get(id); err == nil {
			if _, err := m.store.AppendEvent(Event{Type: EventServiceFailed, SandboxID: id, Reason: se.Service + ": " + PublicMessage(se.Err), Incarnation: rec.Incarnation, Labels: rec.Spec.Labels}); err != nil {
				m.log.Warn("recording a failed service", zap.String("id", id), zap.Error(err))
			}
		}
	}
	// A container (a group: every member) left running without a ready app only holds memory.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := m.runtime.Stop(ctx, id); err != nil && !errors.Is(err, ErrContainerNotFound) {
		m.log.Warn("stopping failed sandbox", zap.String("id", id), zap.Error(err))
	}
}

// reasonOf gives the short reason recorded with an error transition.
func reasonOf(err error) string {
	var se *ServiceError
	switch {
	case errors.As(err, &se):
		return "service_failed"
	case errors.Is(err, ErrUnavailable):
		return "engine_unavailable"
	case errors.Is(err, ErrImageNotFound):
		return "image_missing"
	case errors.Is(err, ErrIDTaken):
		return "id_taken"
	case errors.Is(err, ErrNotReady), errors.Is(err, context.DeadlineExceeded):
		return "not_ready"
	default:
		return "start_failed"
	}
}
