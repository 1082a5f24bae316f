package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sync/singleflight"
)

// WakeResult is the outcome of one wake, as reported to observers (metrics).
type WakeResult struct {
	ID       string
	From     State
	Err      error
	Duration time.Duration
}

// Wake brings sandbox id to running and returns its record. Concurrent calls
// for the same sandbox share one wake (singleflight). The wake runs on the
// manager's context bounded by WakeTimeout, so a caller whose ctx ends gets
// ctx.Err() at once while the wake goes on for the others.
//
// paused → unpause; stopped → start; killed, expired, error → recreate from
// the stored spec with the same volume; then the readiness probe. A running
// sandbox returns at once without touching the engine. A transient engine
// failure (ErrUnavailable) leaves the record as it was; other failures put the
// sandbox in state error.
//
// When ctx carries a recording span, the call is traced (see traceWake): the
// span is marked as leading or joining the wake, and a wake it leads makes
// its engine calls and readiness probe child spans of it.
func (m *Manager) Wake(ctx context.Context, id string) (Record, error) {
	return m.await(ctx, id, m.flight(ctx, id))
}

// JoinWake waits for the wake of sandbox id in flight, if there is one, and
// reports whether there was: unlike Wake it never starts one. It is for
// requests that may ride on a wake someone else asked for (a killed sandbox
// being recreated) but must not start one themselves. A recording span in
// ctx is marked as joining, linked to the leader's span.
func (m *Manager) JoinWake(ctx context.Context, id string) (Record, bool, error) {
	m.mu.Lock()
	if _, ok := m.waking[id]; !ok {
		m.mu.Unlock()
		return Record{}, false, nil
	}
	// The mark and the flight end together under mu, so a mark seen here
	// means the flight is still in the group: DoChan joins it.
	m.traceWake(ctx, id, false)
	ch := m.wakes.DoChan(id, m.wakeFn(m.ctx, id))
	m.mu.Unlock()
	rec, err := m.await(ctx, id, ch)
	return rec, true, err
}

func (m *Manager) await(ctx context.Context, id string, ch <-chan singleflight.Result) (Record, error) {
	select {
	case res := <-ch:
		if res.Err != nil {
			return Record{}, res.Err
		}
		return res.Val.(Record), nil
	case <-ctx.Done():
		return Record{}, fmt.Errorf("waiting for sandbox %s: %w", id, ctx.Err())
	}
}

// StartWake starts a wake of sandbox id (or joins the one in flight) without
// waiting for it: for a browser that is shown the warming page at once. ctx
// is only for tracing, as in Wake: the wake does not end with it.
func (m *Manager) StartWake(ctx context.Context, id string) { m.flight(ctx, id) }

// flight starts the wake of sandbox id or joins the one in flight. The
// sandbox is marked waking here, before the flight's goroutine runs, so that
// Waking is true as soon as StartWake or Wake returns or blocks: a request
// right after a wake was asked for joins it instead of being told the
// sandbox is down. The mark and the flight end together (endFlight), so a
// sandbox not marked has no flight: this call leads the one it starts.
func (m *Manager) flight(ctx context.Context, id string) <-chan singleflight.Result {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.waking == nil {
		m.waking = make(map[string]time.Time)
	}
	_, inFlight := m.waking[id]
	if !inFlight {
		m.waking[id] = m.cfg.Now()
	}
	return m.wakes.DoChan(id, m.wakeFn(m.traceWake(ctx, id, !inFlight), id))
}

// wakeFn is the flight of a wake of id, run in ctx: the manager's context,
// carrying the leader's span when the wake is traced.
func (m *Manager) wakeFn(ctx context.Context, id string) func() (any, error) {
	return func() (any, error) { return m.wake(ctx, id) }
}

// endFlight clears the waking mark and forgets the flight in one step under
// mu: a caller of flight either joins this flight before it ends or starts
// a new one with a mark of its own, never a flight whose mark is gone.
func (m *Manager) endFlight(id string) {
	m.mu.Lock()
	delete(m.waking, id)
	delete(m.wakeSpans, id)
	m.wakes.Forget(id)
	m.mu.Unlock()
}

// Waking reports whether a wake of sandbox id is in flight, and since when.
func (m *Manager) Waking(id string) (since time.Time, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	since, ok = m.waking[id]
	return since, ok
}

func (m *Manager) wake(ctx context.Context, id string) (Record, error) {
	done, err := m.track("wake " + id)
	if err != nil {
		m.endFlight(id)
		return Record{}, err
	}
	defer done()
	defer m.endFlight(id) // before done: Close returns with no wake marked
	unlock := m.locks.lock(id)
	defer unlock()

	rec, err := m.store.Get(id)
	if err != nil {
		return Record{}, err
	}
	from := rec.State
	switch from {
	case Running:
		return rec, nil
	case Creating:
		return Record{}, fmt.Errorf("waking sandbox %s: %w: it is still being created", id, ErrConflict)
	case Expired:
		if m.config().ExpiredWake == ExpiredWakeRefuse {
			return Record{}, fmt.Errorf("waking sandbox %s: %w: it expired (expired_wake refuse)", id, ErrConflict)
		}
	}

	start := m.cfg.Now()
	rec, err = m.bringUp(ctx, rec)
	if fn := m.built.OnWake; fn != nil {
		fn(WakeResult{ID: id, From: from, Err: err, Duration: m.cfg.Now().Sub(start)})
	}
	return rec, err
}

// WakePhases are where a wake spent its time: admission (waiting for
// room), the engine (start, unpause or recreate of the container or
// group) and readiness (until the app's port answered).
type WakePhases struct {
	Admission, Engine, Ready time.Duration
	// Total is the whole wake, from its start to the record saying
	// running.
	Total time.Duration
}

// maxLastWakes bounds the wakes LastWake remembers.
const maxLastWakes = 4096

// rememberWake keeps the phases of sandbox id's last wake.
func (m *Manager) rememberWake(id string, ph WakePhases) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lastWakes == nil {
		m.lastWakes = make(map[string]WakePhases)
	}
	if _, ok := m.lastWakes[id]; !ok && len(m.lastWakes) >= maxLastWakes {
		for k := range m.lastWakes { // any one: a page asks within seconds
			delete(m.lastWakes, k)
			break
		}
	}
	m.lastWakes[id] = ph
}

// LastWake reports the phases of sandbox id's last wake by this manager.
func (m *Manager) LastWake(id string) (WakePhases, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ph, ok := m.lastWakes[id]
	return ph, ok
}

// bringUp does the engine work of a wake and records the outcome. It holds the
// sandbox's lock. ctx is the manager's, carrying the leader's span when the
// wake is traced.
func (m *Manager) bringUp(ctx context.Context, rec Record) (Record, error) {
	id := rec.ID
	// A wake the store cannot record would leave a container running
	// behind a record that says otherwise, again on every request: refuse
	// it before touching the engine.
	if err := m.store.Check(); err != nil {
		return Record{}, fmt.Errorf("waking sandbox %s: %w", id, err)
	}
	var ph WakePhases
	began := m.cfg.Now()
	if rec.State != Paused {
		// Paused sandboxes are resident already; everything else needs room.
		actx, s := startSpan(ctx, spanAdmission, id, 0)
		t0 := m.cfg.Now()
		release, err := m.admit(actx, id)
		ph.Admission = m.cfg.Now().Sub(t0)
		s.end(err)
		if err != nil {
			return Record{}, err
		}
		defer release()
	}
	wakeTimeout, _ := m.limits()
	ctx, cancel := context.WithTimeout(ctx, wakeTimeout)
	defer cancel()
	// A sandbox whose policy cannot be enforced stays down; the record is
	// left as it is (the operator's fix, not the sandbox, is wanting).
	if err := m.egressReady(ctx); err != nil {
		return Record{}, fmt.Errorf("waking sandbox %s: %w", id, err)
	}
	m.confirmHostDNS(ctx, &rec)
	recreate, err := m.ensureAddress(ctx, &rec)
	if err == nil && !recreate {
		// Its entry is there unless the gateway restarted over an empty
		// table (a host reboot) and no sync has run yet: a no-op then.
		done := m.firewallShared()
		err = m.applyEgress(&rec)
		done()
	}
	if err != nil {
		return Record{}, fmt.Errorf("waking sandbox %s: %w", id, err)
	}
	rec.Spec.Address = rec.Address
	var (
		c        Container
		reason   string
		unpaused bool
	)
	t0 := m.cfg.Now()
	if recreate {
		// A container made before it had an address takes one only by
		// being made again (the volume is kept).
		c, err = m.recreate(ctx, id, &rec.Spec)
		reason = "recreate"
	} else {
		c, reason, unpaused, err = m.startContainer(ctx, rec)
	}
	ph.Engine = m.cfg.Now().Sub(t0)
	if err == nil && !(unpaused && acceptReady(&rec.Spec, m.direct())) {
		// (A container sandwake paused, running and ready, and unpaused
		// now needs no connect probe: its app listened when it was
		// paused, and the kernel accepts on a frozen process's socket
		// anyway, so the probe proved nothing and cost a connect. An HTTP
		// probe still asks the app.)
		rctx, s := startSpan(ctx, spanReadiness, id, rec.Spec.Ports[0])
		t1 := m.cfg.Now()
		err = m.waitReady(rctx, id, &rec.Spec, c.Upstreams)
		ph.Ready = m.cfg.Now().Sub(t1)
		s.end(err)
	}
	if err != nil {
		m.fail(id, err, false)
		return Record{}, fmt.Errorf("waking sandbox %s from %s: %w", id, rec.State, err)
	}
	// Kept before the running state is published: a page told of it asks
	// for them at once.
	ph.Total = m.cfg.Now().Sub(began)
	m.rememberWake(id, ph)
	out, err := m.transition(id, Running, reason, func(r *Record) error {
		m.adopt(r, c)
		if r.State == Expired {
			// A recreated sandbox starts a new lifetime.
			if life := durationOr(r.Spec.MaxLifetime, m.config().MaxLifetime); life > 0 {
				r.ExpiresAt = r.LastActiveAt.Add(life)
			}
		}
		return nil
	})
	if err == nil {
		out.Phases = &ph // every waiter of this wake gets them
	}
	return out, err
}

// startContainer makes the engine run the sandbox's container, choosing the
// cheapest way from the recorded state, and falls back to what the engine
// really shows when the record is stale. It returns the container, the
// reason to record, and whether the container was the one sandwake paused,
// unpaused (its app's process was not restarted).
func (m *Manager) startContainer(ctx context.Context, rec Record) (Container, string, bool, error) {
	id := rec.ID
	var err error
	switch rec.State {
	case Paused:
		if err = m.unpauseTraced(ctx, id); err == nil {
			// Unpausing keeps the container as it was: its ports, and
			// whether it resolves through the forwarder (forgotten, the
			// next wake would rewrite its firewall entry for the host's
			// resolvers and the next start would make it anew).
			return Container{ID: rec.ContainerID, Upstreams: rec.Upstreams, Published: rec.PublishedPorts, DNSForwarded: rec.DNSForwarded}, "wake", true, nil
		}
	case Stopped:
		if m.direct() && (rec.PublishedPorts || publishedUpstreams(rec.Upstreams)) || m.hostDNS(&rec) {
			// Made when ports were published: made again without them
			// (the volume is kept), so no userland proxy runs for it.
			c, err := m.recreate(ctx, id, &rec.Spec)
			return c, "recreate", false, err
		}
		var c Container
		if c, err = m.startTraced(ctx, id, rec.Address); err == nil {
			return c, "wake", false, nil
		}
	default:
		c, err := m.recreate(ctx, id, &rec.Spec)
		return c, "recreate", false, err
	}
	if errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
		return Container{}, "", false, err
	}
	// The record was stale (the container was removed, unpaused or stopped
	// behind sandwake's back): act on what the engine shows.
	c, ierr := m.inspectTraced(ctx, id)
	switch {
	case errors.Is(ierr, ErrContainerNotFound):
		c, err := m.recreate(ctx, id, &rec.Spec)
		return c, "recreate", false, err
	case ierr != nil:
		return Container{}, "", false, ierr
	case c.State == ContainerRunning:
		// Started behind sandwake's back: on a port nobody bound.
		return c, "wake", false, m.bindPort(ctx, id, rec.Address, c)
	case c.State == ContainerPaused:
		if err := m.unpauseTraced(ctx, id); err != nil {
			return Container{}, "", false, err
		}
		return c, "wake", false, nil
	case c.State == ContainerCreated || c.State == ContainerExited || c.State == ContainerDead:
		c, err := m.startTraced(ctx, id, rec.Address)
		return c, "wake", false, err
	default:
		return Container{}, "", false, fmt.Errorf("container is %s: %w", c.State, err)
	}
}

func (m *Manager) recreate(ctx context.Context, id string, spec *Spec) (Container, error) {
	made := *spec
	// A record made before egress policies follows the gateway's default:
	// a runtime that enforces policies itself makes that one.
	made.Egress = m.effectiveEgress(made.Egress)
	if err := m.createTraced(ctx, id, made); err != nil {
		return Container{}, err
	}
	return m.startTraced(ctx, id, spec.Address)
}

// canPause reports whether the runtime can pause sandboxes at all, by a
// freeze (Docker) or a CPU cut (Kubernetes; see Pauser).
func (m *Manager) canPause() bool {
	p, ok := m.raw.(Pauser)
	return !ok || p.CanPause()
}

// direct reports whether the runtime dials sandboxes at their own
// addresses (see DirectUpstreams).
func (m *Manager) direct() bool {
	d, ok := m.raw.(DirectUpstreams)
	return ok && d.Direct()
}

// publishedUpstreams reports whether upstreams were published ports on the
// host's loopback (a container made in upstream mode published).
func publishedUpstreams(ups map[int]string) bool {
	for _, a := range ups {
		if ap, err := netip.ParseAddrPort(a); err == nil && ap.Addr().IsLoopback() {
			return true
		}
	}
	return false
}
