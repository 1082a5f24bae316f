package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// This file holds the warm pool: per template, containers made ahead of
// any create, started, found ready and (by default) paused, so that a
// create from the template claims one instead of making a container.
//
// A pool container is made under the id the sandbox that claims it will
// have: its name, labels and volume are that sandbox's from the start, and
// a claim is the creation of the record with that id (Store.Create refuses
// a second), an unpause and the transition to running. So a pool container
// is, at every point of a crash, either idle (no record: the pool's), or
// claimed by exactly the one record of its id, or removed. The pool's own
// lists live in memory only: a container labelled for the pool that has no
// record and is in none of them (left by an earlier process, or dropped)
// is removed by the pool's sweep, which reconcile runs.

// Pool defaults.
const (
	// DefaultPoolInterval is how often the refill looks at the pools when
	// nothing nudges it.
	DefaultPoolInterval = 2 * time.Second
	// poolWorkers bounds the pool containers made at once.
	poolWorkers = 2
	// poolImageCheck is how often a template's image reference is
	// resolved again (a retagged image makes its pool stale).
	poolImageCheck = 15 * time.Second
	// poolFailBackoff pauses the refill of a template whose last fill
	// failed.
	poolFailBackoff = 20 * time.Second
)

// Reasons a pool container is removed (caddy_sandwake_pool_removed_total).
const (
	PoolRemovedStale    = "stale"    // its template's shape or image changed, or the template is gone
	PoolRemovedAge      = "max_age"  // older than the pool's max_age
	PoolRemovedSurplus  = "surplus"  // more idle than max_idle
	PoolRemovedPressure = "pressure" // memory pressure or pool_memory_max
	PoolRemovedDied     = "died"     // it stopped, or was removed, behind sandwake's back
	PoolRemovedLeftover = "leftover" // a pool container no list knows (an earlier process's)
	PoolRemovedFailed   = "failed"   // it could not be made ready, or a claim could not wake it
)

// poolSlot is one idle pool container.
type poolSlot struct {
	id        string
	key       string
	addr      netip.Addr
	born      time.Time
	upstreams map[int]string
	memoryMB  int64
	container string    // the engine's container id
	ready     time.Time // when it joined the idle list
	// forwarded: the container resolves through the egress forwarder;
	// members: its services' states (a group).
	forwarded bool
	members   map[string]ContainerState
}

// templatePool is one template's pool.
type templatePool struct {
	t         Template
	key       string // current shape ("" until the image is resolved)
	keyAt     time.Time
	memoryMB  int64       // a container's memory_mb, the gateway's default filled in
	idle      []*poolSlot // oldest first
	filling   int
	failedAt  time.Time
	lastError string
	hits      uint64
	misses    map[string]uint64
	refills   uint64
}

// pool is the Manager's warm pools.
type pool struct {
	mu        sync.Mutex
	templates map[string]*templatePool
	order     []string // template names as configured
	// busy holds the ids of pool containers being made or claimed: the
	// sweep leaves them alone.
	busy    map[string]bool
	removed map[string]uint64
	// making holds the firewall entries of containers being made or
	// claimed.
	making map[string]FirewallEntry
	// egress fills the gateway's default policy into a template's.
	egress func(Egress) Egress
	nudge  chan struct{}
	sem    chan struct{}
}

func newPool() *pool {
	return &pool{
		templates: map[string]*templatePool{},
		busy:      map[string]bool{},
		making:    map[string]FirewallEntry{},
		removed:   map[string]uint64{},
		nudge:     make(chan struct{}, 1),
		sem:       make(chan struct{}, poolWorkers),
	}
}

// poke wakes the refill loop.
func (p *pool) poke() {
	select {
	case p.nudge <- struct{}{}:
	default:
	}
}

// setTemplates makes the pools match ts (construction and reloads). With
// reshape (a reload) every template's key is worked out again before its
// idle containers can be claimed; those of another shape are then found
// stale by the refill.
func (p *pool) setTemplates(ts []Template, reshape bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.order = p.order[:0]
	seen := map[string]bool{}
	for _, t := range ts {
		seen[t.Name] = true
		p.order = append(p.order, t.Name)
		tp := p.templates[t.Name]
		if tp == nil {
			tp = &templatePool{misses: map[string]uint64{}}
			p.templates[t.Name] = tp
		}
		if reshape || !templateEqual(&tp.t, &t) {
			tp.key, tp.keyAt = "", time.Time{} // resolved again, then compared
			tp.failedAt = time.Time{}
		}
		tp.t = t
	}
	for name, tp := range p.templates {
		if !seen[name] {
			tp.t.Pool = PoolConfig{} // drained by the refill, then forgotten
		}
	}
	p.poke()
}

func templateEqual(a, b *Template) bool {
	return a.Name == b.Name && poolKey("", a.Pool.State, &a.Spec) == poolKey("", b.Pool.State, &b.Spec) && a.Spec.Image == b.Spec.Image
}

// Template returns the configured template named name.
func (m *Manager) Template(name string) (Template, bool) {
	for _, t := range m.config().Templates {
		if t.Name == name {
			return t, true
		}
	}
	return Template{}, false
}

// TemplateStatus is a template and its pool's figures.
type TemplateStatus struct {
	Template Template
	// Idle is how many idle containers of the current shape are ready;
	// Filling how many are being made.
	Idle, Filling int
	// Hits and Misses count claims (misses by reason).
	Hits   uint64
	Misses map[string]uint64
	// Refills counts pool containers made.
	Refills uint64
	// LastError is the last fill's error while the refill backs off.
	LastError string
}

// Templates returns every configured template with its pool's figures, in
// configuration order.
func (m *Manager) Templates() []TemplateStatus {
	p := m.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]TemplateStatus, 0, len(p.order))
	for _, name := range p.order {
		tp := p.templates[name]
		st := TemplateStatus{Template: tp.t, Filling: tp.filling, Hits: tp.hits, Misses: maps.Clone(tp.misses), Refills: tp.refills, LastError: tp.lastError}
		for _, s := range tp.idle {
			if s.key == tp.key {
				st.Idle++
			}
		}
		out = append(out, st)
	}
	return out
}

// PoolRemoved returns how many pool containers were removed, by reason.
func (m *Manager) PoolRemoved() map[string]uint64 {
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	return maps.Clone(m.pool.removed)
}

// PoolOutcome says whether a create from a template claimed a pool
// container and, when not, why.
type PoolOutcome struct {
	Hit    bool
	Reason string
}

// take removes an idle container of template name's current shape from
// the pool (the oldest) and marks it busy; nil when there is none.
func (p *pool) take(name string) *poolSlot {
	p.mu.Lock()
	defer p.mu.Unlock()
	tp := p.templates[name]
	if tp == nil || tp.key == "" {
		return nil
	}
	for i, s := range tp.idle {
		if s.key == tp.key {
			tp.idle = slices.Delete(tp.idle, i, i+1)
			p.busy[s.id] = true
			// Its rules stay in the firewall's view until the claim ends.
			if e, ok := p.entry(tp, s); ok {
				p.making[s.id] = e
			}
			return s
		}
	}
	return nil
}

// entry is the firewall entry of idle container s of pool tp.
func (p *pool) entry(tp *templatePool, s *poolSlot) (FirewallEntry, bool) {
	if !s.addr.IsValid() || p.egress == nil {
		return FirewallEntry{}, false
	}
	return FirewallEntry{ID: s.id, Address: s.addr, Egress: p.egress(tp.t.Spec.Egress)}, true
}

func (p *pool) count(name string, hit bool, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	tp := p.templates[name]
	if tp == nil {
		return
	}
	if hit {
		tp.hits++
	} else {
		tp.misses[reason]++
	}
}

func (p *pool) done(id string) {
	p.mu.Lock()
	delete(p.busy, id)
	delete(p.making, id)
	p.mu.Unlock()
}

// claim turns an idle pool container into sandbox id (whose spec is the
// template's plus the caller's other fields): the sandbox's egress rules
// replace the pool's, the container is woken, and the record is created
// running under the container's id, in one synced write. A crash before
// the write leaves a pool container without a record, which the sweep
// removes; after it, a sandbox. On failure the container is removed, or,
// when admission refused (admitted false), left untouched for the caller
// to put back; the caller holds it busy throughout and creates cold.
func (m *Manager) claim(s *poolSlot, t *Template, spec Spec) (rec Record, admitted bool, err error) {
	id := s.id
	release, err := m.admit(m.ctx, id)
	if err != nil {
		return Record{}, false, err // the caller puts the container back
	}
	defer release()
	unlock := m.locks.lock(id)
	defer unlock()
	now := m.cfg.Now().UTC()
	rec = Record{ID: id, Spec: spec, State: Running, CreatedAt: now, LastActiveAt: now, StateSince: now, VerifiedAt: now,
		Incarnation: NewIncarnation(), Address: s.addr, Template: t.Name, ContainerID: s.container, Upstreams: s.upstreams,
		DNSForwarded: s.forwarded, ServiceStates: s.members}
	if life := durationOr(spec.MaxLifetime, m.config().MaxLifetime); life > 0 {
		rec.ExpiresAt = now.Add(life)
	}
	if m.built.Firewall != nil && s.addr.IsValid() {
		m.pool.mu.Lock()
		m.pool.making[id] = FirewallEntry{ID: id, Address: s.addr, Egress: m.effectiveEgress(spec.Egress)}
		m.pool.mu.Unlock()
	}
	fwDone := m.firewallShared()
	err = m.applyEgress(&rec)
	fwDone()
	if err == nil && !sameEgress(m.effectiveEgress(spec.Egress), m.effectiveEgress(t.Spec.Egress)) {
		// A runtime that enforces egress itself made the pool container
		// with the template's policy: the claimant's replaces it.
		err = m.applyRuntimeEgress(&rec)
	}
	if err == nil && m.poolPaused(t) {
		wakeTimeout, _ := m.limits()
		wctx, cancel := context.WithTimeout(m.ctx, wakeTimeout)
		err = m.runtime.Unpause(wctx, id)
		cancel()
	}
	if err == nil {
		fwDone = m.firewallShared()
		_, _, err = m.store.Create(rec, "pool_claim")
		fwDone()
	}
	if err != nil {
		m.dropSlot(s, PoolRemovedFailed)
		if errors.Is(err, ErrStoreUnavailable) {
			// The record may have landed all the same: read it again once
			// the store takes writes (its container is gone: killed).
			m.markUnrecorded(id)
		}
		return Record{}, true, fmt.Errorf("claiming pool container %s of template %s: %w", id, t.Name, err)
	}
	m.setState(id, Running)
	// The pool made the volume for this claim: the claiming record owns it.
	m.recordOwner(&rec)
	m.log.Info("sandbox claimed from the pool", zap.String("id", id), zap.String("template", t.Name))
	return rec, true, nil
}

// poolPaused reports whether template t's pool keeps its containers
// paused: as the template says, on a runtime whose pause is a freeze. One
// that cannot pause, or whose pause only throttles (Pauser), runs them: a
// hit would wait out the throttle the pool exists to spare.
func (m *Manager) poolPaused(t *Template) bool {
	p, ok := m.raw.(Pauser)
	return t.Pool.State == PoolPaused && (!ok || p.CanPause() && p.PauseFreezes())
}

// sameEgress reports whether a and b are the same policy.
func sameEgress(a, b Egress) bool {
	return a.Policy == b.Policy && slices.Equal(a.Allow, b.Allow) && slices.Equal(a.Deny, b.Deny)
}

// effectiveEgress is e with the gateway's default policy filled in.
func (m *Manager) effectiveEgress(e Egress) Egress {
	if e.Policy == "" {
		if e.Policy = m.built.Egress.Default; e.Policy == "" {
			e.Policy = EgressPublic
		}
	}
	return e
}

// putBack returns an untouched claimed container to its pool, or removes
// it when its template is gone meanwhile.
func (m *Manager) putBack(name string, s *poolSlot) {
	p := m.pool
	p.mu.Lock()
	tp := p.templates[name]
	if tp != nil && s.key == tp.key {
		tp.idle = append([]*poolSlot{s}, tp.idle...)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	m.dropSlot(s, PoolRemovedStale)
}

// dropSlot removes pool container s (its container, volume, address and
// firewall entry) and counts it under reason.
func (m *Manager) dropSlot(s *poolSlot, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.runtime.Remove(ctx, s.id); err != nil && !errors.Is(err, ErrContainerNotFound) {
		m.log.Warn("removing pool container", zap.String("id", s.id), zap.Error(err))
	}
	m.unbindPort(s.id, s.addr)
	if _, err := m.runtime.RemoveVolume(ctx, s.id); err != nil && !errors.Is(err, ErrNotFound) {
		m.log.Warn("removing pool container's volume", zap.String("id", s.id), zap.Error(err))
	}
	m.pool.mu.Lock()
	delete(m.pool.making, s.id) // before the address can go to another
	m.pool.mu.Unlock()
	if s.addr.IsValid() {
		m.forgetAddress(s.id, s.addr)
	}
	m.pool.mu.Lock()
	m.pool.removed[reason]++
	m.pool.mu.Unlock()
	m.log.Info("pool container removed", zap.String("id", s.id), zap.String("reason", reason))
}

// runPool is the refill loop: it keeps each template's pool between
// min_idle and max_idle of its current shape, removing stale, old and
// surplus containers, making at most poolWorkers at once, emptiest
// template first. It rests while the engine's breaker is open.
func (m *Manager) runPool(interval time.Duration) {
	m.sweepAtStart()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		m.poolPass()
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		case <-m.pool.nudge:
		}
	}
}

// sweepAtStart removes the pool containers an earlier process left before
// the first fill: they hold addresses this process does not know of.
func (m *Manager) sweepAtStart() {
	if len(m.config().Templates) == 0 {
		return // a reconcile sweeps those of a gateway that had a pool
	}
	ctx, cancel := context.WithTimeout(m.ctx, time.Minute)
	defer cancel()
	now := m.cfg.Now()
	containers, err := m.runtime.List(ctx)
	if err != nil {
		return
	}
	known := map[string]bool{}
	for i := range containers {
		if c := &containers[i]; c.Pool != "" {
			if _, err := m.store.Get(c.SandboxID); err == nil {
				known[c.SandboxID] = true
			}
		}
	}
	m.sweepPool(containers, known, now)
}

// poolPass is one look at every pool.
func (m *Manager) poolPass() {
	if open, _ := m.BreakerOpen(); open {
		return
	}
	p := m.pool
	now := m.cfg.Now()
	m.refreshKeys(now)
	var drop []*poolSlot
	var reasons []string
	cfg := m.config()
	memMax := cfg.PoolMemoryMaxMB
	// Under min_free_memory's line (with a container's memory added) the
	// pool is not refilled: memory pressure would shed it again.
	var availMB int64 = -1
	if cfg.MinFreeMemory > 0 && cfg.MemAvailable != nil {
		if avail, err := cfg.MemAvailable(); err == nil {
			availMB = int64(avail>>20) - int64(cfg.MinFreeMemory>>20)
		}
	}
	p.mu.Lock()
	var memUsed int64
	for name, tp := range p.templates {
		keep := tp.idle[:0]
		for _, s := range tp.idle {
			switch {
			case tp.t.Pool.MaxIdle == 0 || (tp.key != "" && s.key != tp.key):
				drop, reasons = append(drop, s), append(reasons, PoolRemovedStale)
			case tp.t.Pool.MaxAge > 0 && now.Sub(s.born) > tp.t.Pool.MaxAge:
				drop, reasons = append(drop, s), append(reasons, PoolRemovedAge)
			case len(keep) >= tp.t.Pool.MaxIdle:
				drop, reasons = append(drop, s), append(reasons, PoolRemovedSurplus)
			default:
				keep = append(keep, s)
				memUsed += s.memoryMB
			}
		}
		memUsed += int64(tp.filling) * tp.memoryMB
		tp.idle = keep
		if tp.t.Pool.MaxIdle == 0 && len(tp.idle) == 0 && tp.filling == 0 && !slices.Contains(p.order, name) {
			delete(p.templates, name)
		}
	}
	for _, s := range drop {
		p.busy[s.id] = true
	}
	p.mu.Unlock()
	for i, s := range drop {
		m.dropSlot(s, reasons[i])
		p.done(s.id)
	}
	// Fill, emptiest template first, while workers are free.
	for {
		p.mu.Lock()
		var best *templatePool
		bestFill := 2.0
		for _, name := range p.order {
			tp := p.templates[name]
			have := len(tp.idle) + tp.filling
			if tp.key == "" || have >= tp.t.Pool.MinIdle || now.Sub(tp.failedAt) < poolFailBackoff {
				continue
			}
			if memMax > 0 && memUsed+tp.memoryMB > memMax {
				continue
			}
			if availMB >= 0 && availMB < tp.memoryMB+1 {
				continue
			}
			if f := float64(have) / float64(tp.t.Pool.MinIdle); f < bestFill {
				best, bestFill = tp, f
			}
		}
		if best == nil {
			p.mu.Unlock()
			return
		}
		select {
		case p.sem <- struct{}{}:
		default:
			p.mu.Unlock()
			return
		}
		best.filling++
		memUsed += best.memoryMB
		if availMB >= 0 {
			availMB -= best.memoryMB
		}
		t, key := best.t, best.key
		id := NewID(now)
		p.busy[id] = true
		p.mu.Unlock()
		m.goTask("pool fill "+t.Name, func() {
			defer func() { <-p.sem }()
			m.fill(t, key, id)
		})
	}
}

// refreshKeys resolves each template's image again when due and sets its
// current key.
func (m *Manager) refreshKeys(now time.Time) {
	p := m.pool
	p.mu.Lock()
	var due []Template
	for _, name := range p.order {
		tp := p.templates[name]
		// A template whose image could not be resolved rests as a failed
		// fill does, instead of pulling again at every pass.
		if tp.t.Pool.MaxIdle > 0 && (tp.key == "" || now.Sub(tp.keyAt) >= poolImageCheck) && now.Sub(tp.failedAt) >= poolFailBackoff {
			due = append(due, tp.t)
		}
	}
	p.mu.Unlock()
	for _, t := range due {
		key, mem, err := m.templateKey(t)
		p.mu.Lock()
		if tp := p.templates[t.Name]; tp != nil && templateEqual(&tp.t, &t) {
			if err != nil {
				tp.lastError = PublicMessage(err) // the engine's words are logged below
				tp.failedAt = now
			} else {
				tp.key, tp.keyAt, tp.memoryMB = key, now, mem
			}
		}
		p.mu.Unlock()
		if err != nil && m.ctx.Err() == nil {
			m.log.Warn("reading a template's image", zap.String("template", t.Name), zap.Error(err))
		}
	}
}

// templateKey is t's current shape: its image's id (pulled under the
// runtime's policy when missing) and its container-shaping fields.
func (m *Manager) templateKey(t Template) (string, int64, error) {
	ctx, cancel := context.WithTimeout(m.ctx, m.config().WakeTimeout)
	defer cancel()
	imageID := t.Spec.Image
	if r, ok := m.raw.(ImageResolver); ok {
		id, err := r.ImageID(ctx, t.Spec.Image)
		if errors.Is(err, ErrImageNotFound) {
			if ic, ok := m.raw.(ImageChecker); ok {
				if err = ic.CheckImage(ctx, t.Spec.Image); err == nil {
					id, err = r.ImageID(ctx, t.Spec.Image)
				}
			}
		}
		if err != nil {
			return "", 0, fmt.Errorf("template %s: resolving image %s: %w", t.Name, t.Spec.Image, err)
		}
		imageID = id
	}
	spec := t.Spec
	if err := m.checkSpec(&spec); err != nil {
		return "", 0, fmt.Errorf("template %s: %w", t.Name, err)
	}
	return poolKey(imageID, t.Pool.State, &spec), spec.GroupMemoryMB(), nil
}

// fill makes one pool container of template t: address and rules first
// (as a create does), then the container, started, found ready and, for a
// paused pool, paused.
func (m *Manager) fill(t Template, key, id string) {
	p := m.pool
	defer p.done(id)
	counted, err := m.fillOne(t, key, id)
	p.mu.Lock()
	tp := p.templates[t.Name]
	if tp != nil && !counted {
		tp.filling--
	}
	if err == nil && tp != nil && !counted {
		tp.refills++
		tp.lastError = ""
	} else if err != nil && tp != nil && m.ctx.Err() == nil {
		tp.failedAt = m.cfg.Now()
		tp.lastError = PublicMessage(err) // the engine's words are logged below
	}
	p.mu.Unlock()
	if err != nil {
		if m.ctx.Err() == nil {
			m.log.Warn("filling the pool", zap.String("template", t.Name), zap.Error(err))
		}
		return
	}
	p.poke()
}

// fillOne makes the pool container; counted says the idle container, its
// refill and the end of its filling were recorded at once (in one critical
// section, so that the pool's figures never count it twice or not at all).
func (m *Manager) fillOne(t Template, key, id string) (counted bool, err error) {
	wakeTimeout, _ := m.limits()
	ctx, cancel := context.WithTimeout(m.ctx, wakeTimeout)
	defer cancel()
	spec := t.Spec
	if err := m.checkSpec(&spec); err != nil {
		return false, err
	}
	if err := m.egressReady(ctx); err != nil {
		return false, err
	}
	addr, err := m.allocate(ctx, id)
	if err != nil {
		return false, err
	}
	s := &poolSlot{id: id, key: key, addr: addr, born: m.cfg.Now(), memoryMB: spec.GroupMemoryMB()}
	fail := func(err error) error {
		m.dropSlot(s, PoolRemovedFailed)
		return err
	}
	if fw := m.built.Firewall; fw != nil && addr.IsValid() {
		entry := FirewallEntry{ID: id, Address: addr, Egress: m.effectiveEgress(spec.Egress)}
		m.pool.mu.Lock()
		m.pool.making[id] = entry // until fill's done, or the drop of a failed fill
		m.pool.mu.Unlock()
		done := m.firewallShared()
		err := fw.Apply(entry)
		done()
		if err != nil {
			return false, fail(err)
		}
	}
	spec.Address = addr
	spec.Pool = PoolTag{Template: t.Name, Key: key}
	c, err := m.runtime.Create(ctx, id, spec)
	if err == nil {
		c, err = m.startBound(ctx, id, addr)
	}
	if err == nil {
		err = m.waitReady(ctx, id, &spec, c.Upstreams)
	}
	if err == nil && m.poolPaused(&t) {
		err = m.runtime.Pause(ctx, id)
	}
	if err != nil {
		return false, fail(fmt.Errorf("making pool container %s: %w", id, err))
	}
	s.upstreams, s.container, s.forwarded, s.members = c.Upstreams, c.ID, c.DNSForwarded, c.Members
	m.pool.mu.Lock()
	s.ready = m.cfg.Now()
	tp := m.pool.templates[t.Name]
	if tp == nil || tp.key != key {
		m.pool.mu.Unlock()
		m.dropSlot(s, PoolRemovedStale)
		return false, nil
	}
	tp.idle = append(tp.idle, s)
	tp.filling--
	tp.refills++
	tp.lastError = ""
	m.pool.mu.Unlock()
	if _, err := m.store.AppendEvent(Event{Type: EventPoolFilled, SandboxID: id, Reason: t.Name}); err != nil {
		m.log.Warn("recording a pool fill", zap.String("id", id), zap.Error(err))
	}
	return true, nil
}

// poolFirewallEntries are the firewall entries of the pool's containers
// (SyncFirewall keeps them beside the records').
func (m *Manager) poolFirewallEntries() []FirewallEntry {
	p := m.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []FirewallEntry
	for _, e := range p.making {
		out = append(out, e)
	}
	for _, tp := range p.templates {
		for _, s := range tp.idle {
			if e, ok := p.entry(tp, s); ok {
				out = append(out, e)
			}
		}
	}
	return out
}

// poolHeld reports whether id is a pool container the pool knows (idle,
// being made or claimed).
func (p *pool) held(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busy[id] {
		return true
	}
	for _, tp := range p.templates {
		for _, s := range tp.idle {
			if s.id == id {
				return true
			}
		}
	}
	return false
}

// sweepPool is reconcile's part for pool containers without a record:
// an idle one whose container stopped or vanished is dropped, one no list
// knows is removed.
func (m *Manager) sweepPool(containers []Container, known map[string]bool, listedAt time.Time) {
	p := m.pool
	listed := make(map[string]*Container)
	for i := range containers {
		if c := &containers[i]; c.Pool != "" && !known[c.SandboxID] {
			listed[c.SandboxID] = c
		}
	}
	var died []*poolSlot
	p.mu.Lock()
	for _, tp := range p.templates {
		keep := tp.idle[:0]
		for _, s := range tp.idle {
			c := listed[s.id]
			if s.ready.After(listedAt) {
				keep = append(keep, s) // made after the list was taken
				continue
			}
			want := ContainerRunning
			if m.poolPaused(&tp.t) {
				want = ContainerPaused
			}
			if c == nil || c.State != want {
				died = append(died, s)
				p.busy[s.id] = true
				continue
			}
			keep = append(keep, s)
		}
		tp.idle = keep
	}
	p.mu.Unlock()
	for _, s := range died {
		m.dropSlot(s, PoolRemovedDied)
		p.done(s.id)
	}
	for id := range listed {
		if p.held(id) {
			continue
		}
		unlock, ok := m.locks.tryLock(id)
		if !ok {
			continue
		}
		if _, err := m.store.Get(id); errors.Is(err, ErrNotFound) && !p.held(id) {
			m.dropLeftover(id)
		}
		unlock()
	}
	if len(died) > 0 {
		p.poke()
	}
}

// shedPool removes one idle pool container (the largest pool's oldest) to
// give its memory back; it reports whether there was one. Memory pressure
// calls it before it evicts any sandbox.
func (m *Manager) shedPool() bool {
	p := m.pool
	p.mu.Lock()
	var from *templatePool
	for _, tp := range p.templates {
		if len(tp.idle) > 0 && (from == nil || len(tp.idle) > len(from.idle)) {
			from = tp
		}
	}
	if from == nil {
		p.mu.Unlock()
		return false
	}
	s := from.idle[0]
	from.idle = from.idle[1:]
	from.failedAt = m.cfg.Now() // no refill into the pressure at once
	p.busy[s.id] = true
	p.mu.Unlock()
	m.dropSlot(s, PoolRemovedPressure)
	p.done(s.id)
	return true
}

// dropLeftover removes a pool container without a record that no list
// knows (an earlier process's). Its volume goes with it when it is empty;
// one holding files may be a claimed sandbox's whose record was lost (a
// store restored from an older backup): it is kept, and logged, as an
// orphan's would be.
func (m *Manager) dropLeftover(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := m.runtime.Inspect(ctx, id); errors.Is(err, ErrContainerNotFound) && !errors.Is(err, ErrGroupIncomplete) {
		return // an earlier sweep's (its list was older than the removal)
	}
	empty := false
	if wc, ok := m.raw.(WorkspaceChecker); ok {
		empty, _ = wc.WorkspaceEmpty(ctx, id)
	}
	if empty {
		m.dropSlot(&poolSlot{id: id}, PoolRemovedLeftover)
		return
	}
	if err := m.runtime.Remove(ctx, id); err != nil && !errors.Is(err, ErrContainerNotFound) {
		m.log.Warn("removing a leftover pool container", zap.String("id", id), zap.Error(err))
		return
	}
	m.pool.mu.Lock()
	m.pool.removed[PoolRemovedLeftover]++
	m.pool.mu.Unlock()
	m.log.Warn("a pool container without a record had files in its workspace: the container was removed, its volume kept (purge it when it is not wanted)",
		zap.String("id", id))
}
