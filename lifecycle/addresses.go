package lifecycle

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"
)

// This file holds what the Manager does for egress enforcement: the
// sandbox network, the fixed address each sandbox holds from create to
// destroy, and the firewall entries keyed by it. An address is chosen and
// its rules installed before the container exists, so the app's first
// packet already meets its policy, and it is handed out again only after
// the sandbox is gone and its entry replaced.

// firewallShared marks a change of a record and its firewall entry, made
// together: SyncFirewall, which reads every record and makes the firewall
// match, waits for it (and it for SyncFirewall). Call the result when done.
func (m *Manager) firewallShared() (done func()) {
	m.fwMu.RLock()
	return m.fwMu.RUnlock
}

// errNoSandboxNet: the runtime does not put sandboxes on a network of its
// own (upstream mode network), so nothing can key rules by address.
var errNoSandboxNet = fmt.Errorf("%w: the runtime puts sandboxes on a network it does not own (upstream_mode network), where sandwake cannot fix their addresses; use upstream_mode published, or set egress unenforced", ErrEgressUnenforced)

// sandboxNet returns the sandbox network, making it and installing the
// firewall's table for it on first use (and again after a failure).
func (m *Manager) sandboxNet(ctx context.Context) (SandboxNet, error) {
	m.netMu.Lock()
	defer m.netMu.Unlock()
	if m.net != nil {
		return *m.net, nil
	}
	nr, ok := m.raw.(NetworkRuntime)
	if !ok {
		return SandboxNet{}, errNoSandboxNet
	}
	n, err := nr.SandboxNetwork(ctx)
	if err != nil {
		return SandboxNet{}, err
	}
	if fw := m.built.Firewall; fw != nil {
		if err := fw.Setup(ctx, n); err != nil {
			return SandboxNet{}, err
		}
	}
	m.net = &n
	return n, nil
}

// egressReady fails (wrapping ErrEgressUnenforced or the engine's error)
// when a sandbox must not start because its policy cannot be enforced.
func (m *Manager) egressReady(ctx context.Context) error {
	if m.built.Firewall == nil {
		return nil
	}
	_, err := m.sandboxNet(ctx)
	return err
}

// EgressStatus reports whether egress policies are enforced: nil when they
// are (the firewall is in place, or the runtime enforces them itself: an
// EgressEnforcer), an error wrapping ErrEgressUnenforced (with the fix) when they
// cannot be, and ErrEgressUnenforced itself when the operator turned
// enforcement off.
func (m *Manager) EgressStatus(ctx context.Context) error {
	if m.built.Firewall == nil {
		if m.runtimeEnforcesEgress() {
			return nil
		}
		return ErrEgressUnenforced
	}
	return m.egressReady(ctx)
}

// runtimeEnforcesEgress reports whether the runtime enforces policies
// itself (EgressEnforcer).
func (m *Manager) runtimeEnforcesEgress() bool {
	ee, ok := m.raw.(EgressEnforcer)
	return ok && ee.EnforcesEgress()
}

// checkRuntimeEgress refuses a normalized policy the runtime cannot
// enforce (EgressEnforcer.CheckEgress), before anything is stored.
func (m *Manager) checkRuntimeEgress(e Egress) error {
	ee, ok := m.raw.(EgressEnforcer)
	if !ok || !ee.EnforcesEgress() {
		return nil
	}
	if err := ee.CheckEgress(e); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	return nil
}

// applyRuntimeEgress puts rec's changed policy in force on a runtime that
// enforces policies itself.
func (m *Manager) applyRuntimeEgress(rec *Record) error {
	ee, ok := m.raw.(EgressEnforcer)
	if !ok || !ee.EnforcesEgress() {
		return nil
	}
	wakeTimeout, _ := m.limits()
	ctx, cancel := context.WithTimeout(m.ctx, wakeTimeout)
	defer cancel()
	spec := rec.Spec
	spec.Egress = m.effectiveEgress(spec.Egress)
	if err := ee.ApplyEgress(ctx, rec.ID, spec); err != nil {
		return fmt.Errorf("putting the egress policy of sandbox %s in force: %w", rec.ID, err)
	}
	return nil
}

// allocate reserves the lowest free address of the sandbox network for
// sandbox id; the zero address when the runtime has no network of its own.
func (m *Manager) allocate(ctx context.Context, id string) (netip.Addr, error) {
	if _, ok := m.raw.(NetworkRuntime); !ok {
		return netip.Addr{}, nil
	}
	n, err := m.sandboxNet(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for a := n.First; a.IsValid() && a.Compare(n.Last) <= 0; a = a.Next() {
		if _, taken := m.addrs[a]; !taken {
			m.addrs[a] = id
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w: every address of the sandbox network %s (%s to %s) is held by a sandbox; destroy some, or give sandbox_subnet a larger range", ErrCapacity, n.Name, n.First, n.Last)
}

// release gives addr back once its sandbox is gone, if id still holds it.
func (m *Manager) release(id string, addr netip.Addr) {
	if !addr.IsValid() {
		return
	}
	m.mu.Lock()
	if m.addrs[addr] == id {
		delete(m.addrs, addr)
	}
	m.mu.Unlock()
}

// hostDNS reports whether rec's container was made before the runtime
// forwarded DNS (it asks the host's resolvers): made again at its next
// start, given the host's resolvers meanwhile.
func (m *Manager) hostDNS(rec *Record) bool {
	f, ok := m.raw.(DNSForwarding)
	return ok && f.ForwardsDNS() && m.built.Firewall != nil && rec.ContainerID != "" && !rec.DNSForwarded
}

// confirmHostDNS checks with the engine a record that says its container
// asks the host's resolvers before a wake acts on it (host resolvers in its
// firewall entry, a new container at its start): a wake from paused by
// an earlier release recorded that of containers that resolve through the
// forwarder. The container's own word is recorded by the wake's adopt.
func (m *Manager) confirmHostDNS(ctx context.Context, rec *Record) {
	if !m.hostDNS(rec) {
		return
	}
	if c, err := m.runtime.Inspect(ctx, rec.ID); err == nil && c.DNSForwarded {
		rec.DNSForwarded = true
	}
}

// applyEgress installs rec's rules. Without a firewall it does nothing.
func (m *Manager) applyEgress(rec *Record) error {
	fw := m.built.Firewall
	if fw == nil || !rec.Address.IsValid() {
		return nil
	}
	e := rec.Spec.Egress
	if e.Policy == "" {
		e.Policy = m.built.Egress.Default
		if e.Policy == "" {
			e.Policy = EgressPublic
		}
	}
	if err := fw.Apply(FirewallEntry{ID: rec.ID, Address: rec.Address, Egress: e, HostDNS: m.hostDNS(rec)}); err != nil {
		return fmt.Errorf("installing the egress rules of sandbox %s: %w", rec.ID, err)
	}
	return nil
}

// forgetAddress removes the firewall entry of a sandbox that is gone and
// frees its address. A failure to remove is logged: the next Apply for the
// address replaces the entry anyway, and Sync removes it.
func (m *Manager) forgetAddress(id string, addr netip.Addr) {
	if !addr.IsValid() {
		return
	}
	if fw := m.built.Firewall; fw != nil {
		if err := fw.Remove(id, addr); err != nil {
			m.log.Warn("removing egress rules", zap.String("id", id), zap.Error(err))
		}
	}
	m.mu.Lock()
	m.deniedGone += m.denied[id] // the total stays a counter
	delete(m.denied, id)
	m.mu.Unlock()
	m.release(id, addr)
}

// ensureAddress gives a sandbox made before addresses existed (or while
// the runtime had none) an address and its rules, and reports whether its
// container must be recreated to take it.
func (m *Manager) ensureAddress(ctx context.Context, rec *Record) (recreate bool, err error) {
	if rec.Address.IsValid() || m.built.Firewall == nil {
		// Without a firewall an address buys nothing worth a recreate.
		return false, nil
	}
	if _, ok := m.raw.(NetworkRuntime); !ok {
		return false, nil
	}
	addr, err := m.allocate(ctx, rec.ID)
	if err != nil {
		return false, err
	}
	defer m.firewallShared()()
	updated, err := m.store.Update(rec.ID, func(r *Record) error {
		r.Address = addr
		return nil
	})
	if err != nil {
		m.release(rec.ID, addr)
		return false, err
	}
	*rec = updated
	return true, m.applyEgress(rec)
}

// SyncFirewall re-asserts the firewall: its table (made again when removed
// by hand or lost with an engine restart), exactly one entry per sandbox
// with an address, none for sandboxes that are gone. The reconcile loop
// calls it; it also refreshes the denied counters.
func (m *Manager) SyncFirewall(ctx context.Context) (FirewallStatus, error) {
	fw := m.built.Firewall
	if fw == nil {
		return FirewallStatus{}, nil
	}
	m.netMu.Lock()
	m.net = nil // Setup again: the table or the network may be gone
	m.netMu.Unlock()
	if _, err := m.sandboxNet(ctx); err != nil {
		return FirewallStatus{}, err
	}
	st, addrs, err := m.syncEntries(fw)
	if err != nil {
		return st, err
	}
	if st.Repaired || st.Added > 0 || st.Removed > 0 {
		m.log.Warn("egress firewall repaired", zap.Bool("table_recreated", st.Repaired), zap.Int("entries_added", st.Added), zap.Int("entries_removed", st.Removed))
	}
	// The bindings after the entries, with the snapshot's lock let go:
	// repairing one takes the sandbox's lock, under which operations take
	// the snapshot's lock to write entries.
	if st.Rebound, err = m.syncBindings(ctx, addrs); err != nil {
		return st, fmt.Errorf("firewall sync: %w", err)
	}
	if st.Rebound > 0 {
		m.log.Warn("port bindings repaired", zap.Int("bound", st.Rebound))
	}
	m.refreshDenied()
	return st, nil
}

// syncEntries makes the firewall's entries exactly the records' and the
// pool's, and returns which sandbox holds each address.
func (m *Manager) syncEntries(fw Firewall) (FirewallStatus, map[netip.Addr]string, error) {
	// No record is written with its entry while the snapshot below is
	// taken and installed: a create or destroy between the two would
	// have its entry removed, or a destroyed sandbox's put back over the
	// address's new holder.
	m.fwMu.Lock()
	defer m.fwMu.Unlock()
	recs, err := m.store.List(nil)
	if err != nil {
		return FirewallStatus{}, nil, fmt.Errorf("firewall sync: %w", err)
	}
	entries := make([]FirewallEntry, 0, len(recs))
	def := m.built.Egress.Default
	if def == "" {
		def = EgressPublic
	}
	for i := range recs {
		if !recs[i].Address.IsValid() {
			continue
		}
		e := recs[i].Spec.Egress
		if e.Policy == "" {
			e.Policy = def
		}
		entries = append(entries, FirewallEntry{ID: recs[i].ID, Address: recs[i].Address, Egress: e, HostDNS: m.hostDNS(&recs[i])})
	}
	entries = append(entries, m.poolFirewallEntries()...)
	st, err := fw.Sync(entries)
	if err != nil {
		return st, nil, fmt.Errorf("firewall sync: %w", err)
	}
	addrs := make(map[netip.Addr]string, len(entries))
	for _, e := range entries {
		addrs[e.Address] = e.ID
	}
	return st, addrs, nil
}

// refreshDenied reads the firewall's counters into the cache EgressDenied
// answers from.
func (m *Manager) refreshDenied() {
	fw := m.built.Firewall
	if fw == nil {
		return
	}
	d, err := fw.Denied()
	if err != nil {
		m.log.Warn("reading egress counters", zap.Error(err))
		return
	}
	m.mu.Lock()
	for id, v := range m.denied {
		if _, ok := d[id]; !ok {
			m.deniedGone += v // removed behind our back (Sync): keep its count
		}
	}
	m.denied = d
	m.deniedAt = m.cfg.Now()
	m.mu.Unlock()
}

// freshDenied refreshes the counters when older than maxAge; it returns
// with mu held.
func (m *Manager) freshDenied(maxAge time.Duration) {
	m.mu.Lock()
	stale := m.cfg.Now().Sub(m.deniedAt) > maxAge
	m.mu.Unlock()
	if stale {
		m.refreshDenied()
	}
	m.mu.Lock()
}

// EgressDenied reports the packets sandbox id's policy refused, as last
// read from the firewall (at most maxAge ago: older counters are read
// again).
func (m *Manager) EgressDenied(id string, maxAge time.Duration) uint64 {
	m.freshDenied(maxAge)
	defer m.mu.Unlock()
	return m.denied[id]
}

// EgressDeniedTotal reports the packets every sandbox's policy refused,
// sandboxes since removed included, as EgressDenied.
func (m *Manager) EgressDeniedTotal(maxAge time.Duration) uint64 {
	m.freshDenied(maxAge)
	defer m.mu.Unlock()
	n := m.deniedGone
	for _, v := range m.denied {
		n += v
	}
	return n
}

// deniedRanges is what an allow entry is checked against beyond the fixed
// list: the firewall's (operator's and host's) when there is one.
func (m *Manager) deniedRanges() []netip.Prefix {
	if fw := m.built.Firewall; fw != nil {
		return fw.DeniedRanges()
	}
	return nil
}
