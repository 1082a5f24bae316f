package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"
)

// Correction kinds.
const (
	CorrectionMissing       = "missing"        // container gone → killed
	CorrectionExited        = "exited"         // container exited → stopped
	CorrectionOOM           = "oom"            // container OOM-killed → stopped
	CorrectionPaused        = "paused"         // paused outside sandwake → paused
	CorrectionRunning       = "running"        // started or unpaused outside sandwake → running
	CorrectionUpstream      = "upstream"       // host port changed (restart outside sandwake)
	CorrectionStuckCreating = "stuck_creating" // creating too long → error
	CorrectionOrphanRemoved = "orphan_removed" // labelled container without record removed
)

// Correction is one change reconcile made to make the store follow the engine.
type Correction struct {
	ID     string
	Kind   string
	From   State
	To     State
	Reason string
}

// ReconcileStats sums up one full reconcile.
type ReconcileStats struct {
	Records     int
	Containers  int
	Corrections map[string]int
	// Orphans are containers labelled as sandwake's with no record.
	Orphans []string
}

// RuntimeEvent is a change of a container the engine reports.
type RuntimeEvent struct {
	SandboxID string
	// Action is the engine's word: die, oom, destroy, pause, unpause, start,
	// health_status.
	Action string
}

// EventSource is implemented by runtimes that can stream container changes.
type EventSource interface {
	// Events streams changes of the runtime's containers until ctx ends or
	// the stream breaks (an error is sent, then both channels are done).
	Events(ctx context.Context) (<-chan RuntimeEvent, <-chan error)
}

// Reconcile compares every record with the engine's containers and corrects
// the store where they differ: the store is the intent, the engine the
// reality. Sandboxes another operation holds are skipped (that operation
// leaves them consistent).
func (m *Manager) Reconcile(ctx context.Context) (ReconcileStats, error) {
	stats := ReconcileStats{Corrections: map[string]int{}}
	done, err := m.track("reconcile")
	if err != nil {
		return stats, err
	}
	defer done()
	listedAt := m.cfg.Now()
	containers, err := m.runtime.List(ctx)
	if err != nil {
		return stats, fmt.Errorf("reconcile: %w", err)
	}
	stats.Containers = len(containers)
	byID := make(map[string]*Container, len(containers))
	for i := range containers {
		if id := containers[i].SandboxID; id != "" {
			byID[id] = &containers[i]
		}
	}
	// Which records need a closer look is decided on the state mirror,
	// taken after the list as the store was read before: a settled
	// sandbox (the common case: a stopped one with its exited container)
	// costs a map lookup, not a decode. Each of the others is read from
	// the store under its lock (reconcileLocked), whose word it is then.
	// The mirror is copied under m.mu, which wakes and transitions take:
	// the walk and the comparisons run after it is let go.
	m.mu.Lock()
	mirror := make([]idState, 0, len(m.states))
	for id, s := range m.states {
		mirror = append(mirror, idState{id, s})
	}
	m.mu.Unlock()
	stats.Records = len(mirror)
	// known: the listed containers that have a record.
	var closer []string
	known := make(map[string]bool, len(byID))
	for _, e := range mirror {
		c := byID[e.id]
		if c != nil {
			known[e.id] = true
		}
		if !settled(e.state, c) {
			closer = append(closer, e.id)
		}
	}
	// A container whose id the mirror does not know is an orphan only if
	// the store has no record either: a record being written (a pool claim)
	// is in the store before the mirror.
	for id := range byID {
		if known[id] {
			continue
		}
		if ctx.Err() != nil {
			return stats, ctx.Err()
		}
		switch _, err := m.store.Get(id); {
		case err == nil:
			known[id] = true
		case !errors.Is(err, ErrNotFound):
			return stats, fmt.Errorf("reconcile: %w", err)
		}
	}
	slices.Sort(closer)
	for _, id := range closer {
		if ctx.Err() != nil {
			return stats, ctx.Err()
		}
		unlock, ok := m.locks.tryLock(id)
		if !ok {
			continue
		}
		c, err := m.reconcileLocked(ctx, id, byID[id], false)
		unlock()
		if err != nil {
			if errors.Is(err, ErrUnavailable) {
				return stats, fmt.Errorf("reconcile: %w", err)
			}
			m.log.Warn("reconcile", zap.String("id", id), zap.Error(err))
			continue
		}
		if c != nil {
			stats.Corrections[c.Kind]++
		}
	}
	// Pool containers without a record are the pool's, not orphans.
	m.sweepPool(containers, known, listedAt)
	cfg := m.config()
	for _, id := range sortedKeys(byID) {
		if known[id] || byID[id].Pool != "" {
			continue
		}
		stats.Orphans = append(stats.Orphans, id)
		if cfg.OrphansRemove {
			if err := m.runtime.Remove(ctx, id); err != nil {
				m.log.Warn("removing orphan container", zap.String("id", id), zap.Error(err))
				continue
			}
			stats.Corrections[CorrectionOrphanRemoved]++
			m.note(Correction{ID: id, Kind: CorrectionOrphanRemoved})
		}
	}
	if !m.directAdopted.Load() && m.direct() {
		if n, err := m.adoptDirect(ctx); err == nil {
			m.directAdopted.Store(true)
			if n > 0 {
				stats.Corrections[CorrectionUpstream] += n
				m.log.Info("running sandboxes made with published ports are now dialled at their own addresses (their ports go at their next recreate)", zap.Int("sandboxes", n))
			}
		}
	}
	m.mu.Lock()
	m.reconciledAt = m.cfg.Now()
	m.mu.Unlock()
	if len(stats.Orphans) > 0 {
		m.log.Warn("containers labelled as sandwake's have no record (orphans)",
			zap.Strings("ids", stats.Orphans), zap.Bool("removed", cfg.OrphansRemove))
	}
	return stats, nil
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// mirrorStored brings the state mirror in line with what the store holds
// for id (to == "": no record), under id's lock. The mirror follows every
// write that reports success; a write that reported a failure yet landed (a
// store that failed to sync its log after applying the write) would leave
// it wrong for good, and the full reconcile, which decides on the mirror,
// would then pass the sandbox over for good.
func (m *Manager) mirrorStored(id string, to State) {
	m.mu.Lock()
	from, ok := m.states[id]
	m.mu.Unlock()
	if (to == "" && !ok) || (ok && from == to) {
		return
	}
	m.log.Warn("state mirror repaired from the store", zap.String("id", id), zap.String("mirror", string(from)), zap.String("store", string(to)))
	m.setState(id, to)
}

// idState is one entry of the state mirror.
type idState struct {
	id    string
	state State
}

// LastReconcile is when a full reconcile last succeeded (zero: never).
func (m *Manager) LastReconcile() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reconciledAt
}

// ReconcileOne reconciles one sandbox against a fresh inspect, waiting for
// any operation on it to finish first. Used for engine events and when a
// request to a sandbox believed running fails.
func (m *Manager) ReconcileOne(ctx context.Context, id string) (*Correction, error) {
	done, err := m.track("reconcile " + id)
	if err != nil {
		return nil, err
	}
	defer done()
	unlock := m.locks.lock(id)
	defer unlock()
	return m.reconcileLocked(ctx, id, nil, true)
}

// reconcileLocked brings one record in line with its container. listed is
// what a container list said (nil: not listed, or not known); inspect forces
// a fresh inspect. The caller holds the sandbox's lock.
func (m *Manager) reconcileLocked(ctx context.Context, id string, listed *Container, inspect bool) (*Correction, error) {
	rec, err := m.store.Get(id)
	if errors.Is(err, ErrNotFound) {
		m.mirrorStored(id, "")
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m.mirrorStored(id, rec.State)
	if rec.State == Creating {
		// Create holds the sandbox's lock from its record's birth to its
		// end, and only this process writes the store: a creating record
		// seen under the lock is a create that died with an earlier
		// process. Its container, if any, is replaced by the next wake.
		return m.correct(rec, Correction{Kind: CorrectionStuckCreating, To: Error, Reason: "stuck_creating"}, nil,
			"creation did not finish (sandwake stopped during it)")
	}
	c := listed
	if inspect || (c != nil && !consistent(rec.State, c.State)) {
		inspect = true
		fresh, err := m.runtime.Inspect(ctx, id)
		switch {
		case errors.Is(err, ErrContainerNotFound):
			c = nil
		case err != nil:
			return nil, err
		default:
			c = &fresh
		}
	}
	if c == nil {
		switch rec.State {
		case Running, Paused, Stopped:
			if rec.State != Stopped {
				// A group missing one of its containers: the next wake
				// makes it again (its volumes kept).
				m.stopBrokenGroup(ctx, &rec)
			}
			return m.correct(rec, Correction{Kind: CorrectionMissing, To: Killed, Reason: "container_missing"}, nil, "")
		}
		return nil, nil
	}
	switch c.State {
	case ContainerRunning:
		switch rec.State {
		case Running:
			if inspect && len(c.Upstreams) > 0 && !maps.Equal(c.Upstreams, rec.Upstreams) {
				return m.correct(rec, Correction{Kind: CorrectionUpstream, To: Running, Reason: "upstream_changed"}, c, "")
			}
		case Paused, Stopped, Killed, Error:
			if !inspect {
				fresh, err := m.runtime.Inspect(ctx, id)
				if err != nil {
					return nil, err
				}
				c = &fresh
			}
			// Started behind sandwake's back (or by a wake whose answer
			// was lost): on a port nobody bound, whose frames are dropped
			// until it is.
			if err := m.bindPort(ctx, id, rec.Address, *c); err != nil {
				m.log.Warn("binding a sandbox started outside sandwake", zap.String("id", id), zap.Error(err))
			}
			// Running is a promise that the port answers. A container
			// started by a wake that died with an earlier process may
			// still be starting its app: leave the record, and the next
			// wake (a start of a running container is a no-op) waits for
			// readiness as usual.
			if !m.answers(ctx, &rec.Spec, c.Upstreams) {
				return nil, nil
			}
			return m.correct(rec, Correction{Kind: CorrectionRunning, To: Running, Reason: "started_outside"}, c, "")
		}
	case ContainerPaused:
		if rec.State == Running || rec.State == Stopped {
			return m.correct(rec, Correction{Kind: CorrectionPaused, To: Paused, Reason: "paused_outside"}, nil, "")
		}
	case ContainerExited, ContainerDead, ContainerCreated:
		if rec.State == Stopped && rec.Reason == exitedReason(oomExitCode) && c.OOMKilled {
			// The engine told the exit first and the OOM kill after it
			// (the runtime reports the exit OOM-killed once it heard):
			// the stop was an OOM kill, and says so now.
			return m.relabelOOM(rec)
		}
		if rec.State == Running || rec.State == Paused {
			// A member of a group exited (or the app did): the next
			// request wakes all of it, in order.
			m.stopBrokenGroup(ctx, &rec)
			if c.OOMKilled {
				return m.correct(rec, Correction{Kind: CorrectionOOM, To: Stopped, Reason: "oom"}, nil, "")
			}
			return m.correct(rec, Correction{Kind: CorrectionExited, To: Stopped, Reason: exitedReason(c.ExitCode)}, nil, "")
		}
	}
	return nil, nil
}

// stopBrokenGroup stops what is left of rec's group, one of whose
// containers exited or is gone, so that nothing runs half a group. A
// sandbox without services has nothing more to stop.
func (m *Manager) stopBrokenGroup(ctx context.Context, rec *Record) {
	if len(rec.Spec.Services) == 0 {
		return
	}
	if err := m.runtime.Stop(ctx, rec.ID); err != nil && !errors.Is(err, ErrContainerNotFound) {
		m.log.Warn("stopping the rest of a broken group", zap.String("id", rec.ID), zap.Error(err))
	}
}

// oomExitCode is the exit code of a process the kernel's OOM killer ended
// (128 + SIGKILL).
const oomExitCode = 137

// exitedReason is the reason of a sandbox whose container exited.
func exitedReason(code int) string { return fmt.Sprintf("exited(%d)", code) }

// errMovedOn: a record changed between its read and the relabel's write.
var errMovedOn = errors.New("the record moved on")

// relabelOOM gives a sandbox stopped as exited(137) its true reason, oom,
// once the engine's late OOM report arrives. The state stays stopped.
func (m *Manager) relabelOOM(rec Record) (*Correction, error) {
	_, err := m.store.Update(rec.ID, func(r *Record) error {
		if r.State != Stopped || r.Reason != exitedReason(oomExitCode) || r.ContainerID != rec.ContainerID {
			return errMovedOn
		}
		r.Reason = "oom"
		return nil
	})
	if errors.Is(err, errMovedOn) {
		return nil, nil // woken, or gone, since it was read: nothing to say
	}
	if err != nil {
		return nil, err
	}
	m.changed(rec.ID)
	c := Correction{ID: rec.ID, Kind: CorrectionOOM, From: Stopped, To: Stopped, Reason: "oom"}
	m.note(c)
	return &c, nil
}

// reconcileProbe bounds the readiness check of a container reconcile finds
// running against its record.
const reconcileProbe = 500 * time.Millisecond

// answers reports whether a sandbox's first port is ready now.
func (m *Manager) answers(ctx context.Context, spec *Spec, upstreams map[int]string) bool {
	addr, ok := upstreams[spec.Ports[0]]
	if !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, reconcileProbe)
	defer cancel()
	return WaitReadyAt(ctx, addr, spec, m.direct()) == nil
}

// settled reports, for a full reconcile, the pairs of record state and listed
// container that need neither a lock nor a closer look.
func settled(s State, c *Container) bool {
	if c == nil {
		return s == Killed || s == Expired || s == Error
	}
	switch s {
	case Running:
		return c.State == ContainerRunning
	case Paused:
		return c.State == ContainerPaused
	case Stopped:
		return c.State == ContainerExited || c.State == ContainerCreated
	}
	return false
}

// consistent reports whether a listed container state agrees with a record's
// state without a closer look.
func consistent(s State, c ContainerState) bool {
	switch s {
	case Running:
		return c == ContainerRunning
	case Paused:
		return c == ContainerPaused
	case Stopped:
		return c == ContainerExited || c == ContainerCreated || c == ContainerDead
	case Error:
		return c != ContainerRunning && c != ContainerPaused
	}
	return true
}

// correct applies a correction as a transition and reports it.
func (m *Manager) correct(rec Record, c Correction, adopt *Container, errText string) (*Correction, error) {
	c.ID, c.From = rec.ID, rec.State
	_, err := m.transition(rec.ID, c.To, c.Reason, func(r *Record) error {
		now := m.cfg.Now().UTC()
		r.VerifiedAt = now
		if errText != "" {
			r.Error = errText
		}
		switch c.To {
		case Stopped:
			r.StoppedAt = now
		case Killed:
			r.ContainerID, r.Upstreams = "", nil
		case Running:
			if adopt != nil {
				r.ContainerID = adopt.ID
				r.Upstreams = adopt.Upstreams
				r.Error = ""
				if r.State != Running {
					// Adopted now: its idle time starts now, not at the
					// last request sandwake saw.
					r.LastActiveAt = now
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if c.To == Stopped || c.To == Killed || c.To == Error {
		// Its container exited or is gone: so is its port. (One started
		// outside sandwake was bound before its probe: reconcileLocked.)
		m.unbindPort(rec.ID, rec.Address)
	}
	m.note(c)
	return &c, nil
}

func (m *Manager) note(c Correction) {
	m.log.Info("reconcile correction", zap.String("id", c.ID), zap.String("kind", c.Kind),
		zap.String("from", string(c.From)), zap.String("to", string(c.To)), zap.String("reason", c.Reason))
	if fn := m.cfg.OnReconcile; fn != nil {
		fn(c)
	}
}

// reconcilePass is the periodic reconcile loop's step.
func (m *Manager) reconcilePass() {
	if _, err := m.Reconcile(m.ctx); err != nil && m.ctx.Err() == nil {
		m.log.Warn("periodic reconcile", zap.Error(err))
	}
	if _, err := m.SyncFirewall(m.ctx); err != nil && m.ctx.Err() == nil {
		m.log.Warn("egress firewall sync", zap.Error(err))
	}
}

// runEvents follows the engine's event stream and reconciles each sandbox
// whose container changed, resubscribing with backoff when the stream breaks
// (and reconciling in full then, for the events it missed).
func (m *Manager) runEvents(src EventSource) {
	backoff := 100 * time.Millisecond
	for m.ctx.Err() == nil {
		ctx, cancel := context.WithCancel(m.ctx)
		evs, errs := src.Events(ctx)
		received := false
	stream:
		for {
			select {
			case <-m.ctx.Done():
				cancel()
				return
			case ev, ok := <-evs:
				if !ok {
					break stream
				}
				if !received {
					received, backoff = true, 100*time.Millisecond
				}
				m.handleRuntimeEvent(ev)
			case err := <-errs:
				if err != nil && m.ctx.Err() == nil {
					m.log.Warn("engine event stream broke; resubscribing", zap.Error(err), zap.Duration("after", backoff))
				}
				break stream
			}
		}
		cancel()
		if !m.backOff(&backoff) {
			return
		}
		if _, err := m.Reconcile(m.ctx); err != nil && m.ctx.Err() == nil {
			m.log.Warn("reconcile after event stream break", zap.Error(err))
		}
	}
}

func (m *Manager) handleRuntimeEvent(ev RuntimeEvent) {
	if ev.SandboxID == "" || !ValidID(ev.SandboxID) {
		return
	}
	// Our own wakes make start and unpause events: nothing to learn from
	// them, and an inspect per wake is Docker work on the wake's path.
	if ev.Action == "start" || ev.Action == "unpause" {
		if _, waking := m.Waking(ev.SandboxID); waking {
			return
		}
		if rec, err := m.store.Get(ev.SandboxID); err == nil && rec.State == Running {
			return
		}
	}
	m.events.add(ev.SandboxID)
}

// eventWorkers is how many goroutines reconcile sandboxes named by engine
// events: enough that one slow inspect does not hold up the others, few
// enough that a burst (a daemon restart reports every container) is not a
// goroutine and an inspect per event at once.
const eventWorkers = 4

// runEventWorker reconciles the sandboxes the event queue hands out until
// the manager closes.
func (m *Manager) runEventWorker() {
	for {
		id, ok := m.events.get()
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
		if _, err := m.ReconcileOne(ctx, id); err != nil && m.ctx.Err() == nil {
			m.log.Warn("reconcile after engine event", zap.String("id", id), zap.Error(err))
		}
		cancel()
		m.events.done(id)
	}
}

// adoptDirect is the upgrade to direct upstreams: a running or paused
// sandbox whose record still names a published port (made by a gateway in
// upstream mode published) sits on the sandbox network at its fixed
// address all the same, so its record takes the addresses the runtime
// reads now, and the gateway dials them at once. It reports how many it
// changed; it runs until one pass went through.
func (m *Manager) adoptDirect(ctx context.Context) (int, error) {
	recs, err := m.residentRecords(func(r *Record) bool { return publishedUpstreams(r.Upstreams) })
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range recs {
		id := recs[i].ID
		unlock := m.locks.lock(id)
		c, err := m.runtime.Inspect(ctx, id)
		if err == nil && len(c.Upstreams) > 0 && !publishedUpstreams(c.Upstreams) {
			_, err = m.store.Update(id, func(r *Record) error {
				r.Upstreams, r.PublishedPorts = c.Upstreams, c.Published
				return nil
			})
			if err == nil {
				m.changed(id)
				n++
			}
		}
		unlock()
		if err != nil && !errors.Is(err, ErrContainerNotFound) {
			return n, err
		}
	}
	return n, nil
}

// backOff waits *d before an event stream is followed again, or until the
// Manager closes (false); the next wait is twice as long, at most 10s.
func (m *Manager) backOff(d *time.Duration) bool {
	t := time.NewTimer(*d)
	defer t.Stop()
	select {
	case <-m.ctx.Done():
		return false
	case <-t.C:
	}
	*d = min(*d*2, 10*time.Second)
	return true
}
