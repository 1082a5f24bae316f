package lifecycle

import (
	"context"
	"fmt"
	"net/netip"

	"go.uber.org/zap"
)

// This file ties each running sandbox's address to its own bridge port and
// MAC (Firewall.Bind), so that code given NET_RAW cannot send as another
// sandbox (a forged source address, a gratuitous ARP, a borrowed MAC).

// bindPort binds addr to the port of the container c just started. A
// container the firewall cannot bind is stopped again: its frames would
// be dropped anyway, and a start must not pass for a working one.
func (m *Manager) bindPort(ctx context.Context, id string, addr netip.Addr, c Container) error {
	fw := m.built.Firewall
	if fw == nil || !addr.IsValid() {
		return nil
	}
	if c.Pid == 0 {
		// The runtime's Start answer lacks the process (a runtime that
		// does not say): ask it.
		ic, err := m.runtime.Inspect(ctx, id)
		if err != nil {
			return fmt.Errorf("binding sandbox %s to its bridge port: %w", id, err)
		}
		c.Pid, c.MAC = ic.Pid, ic.MAC
	}
	if err := fw.Bind(PortBinding{ID: id, Address: addr, Pid: c.Pid, MAC: c.MAC}); err != nil {
		return fmt.Errorf("binding sandbox %s to its bridge port: %w", id, err)
	}
	return nil
}

// startBound starts sandbox id's container and binds its address to the
// container's port before anything may reach it (readiness comes after).
func (m *Manager) startBound(ctx context.Context, id string, addr netip.Addr) (Container, error) {
	c, err := m.runtime.Start(ctx, id)
	if err != nil {
		return c, err
	}
	if err := m.bindPort(ctx, id, addr, c); err != nil {
		return Container{}, err
	}
	return c, nil
}

// unbindPort removes addr's binding: its container stopped, or is gone.
func (m *Manager) unbindPort(id string, addr netip.Addr) {
	fw := m.built.Firewall
	if fw == nil || !addr.IsValid() {
		return
	}
	if err := fw.Unbind(addr); err != nil {
		m.log.Warn("removing a sandbox's port binding", zap.String("id", id), zap.Error(err))
	}
}

// syncBindings is reconcile's repair of the port bindings: every running
// or paused sandbox's address bound to its container's current port (a
// container restarted behind sandwake's back, a table recreated, a gateway
// restarted), every other address unbound. addrs names the sandbox (or
// pool container) holding each address. Only addresses whose binding
// disagrees with the state mirror are looked at, each under its sandbox's
// lock with its record read again (a wake binds before its record says
// running). It reports how many it bound.
func (m *Manager) syncBindings(ctx context.Context, addrs map[netip.Addr]string) (int, error) {
	fw := m.built.Firewall
	if fw == nil {
		return 0, nil
	}
	bound, err := fw.Bound()
	if err != nil {
		return 0, fmt.Errorf("reading port bindings: %w", err)
	}
	n := 0
	for addr := range bound {
		if _, ok := addrs[addr]; !ok {
			if err := fw.Unbind(addr); err != nil { // its sandbox is gone
				return n, err
			}
		}
	}
	for addr, id := range addrs {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		if m.wantsBinding(id, false) == bound[addr] {
			continue
		}
		unlock := m.locks.lock(id)
		switch want := m.wantsBinding(id, true); {
		case want && !bound[addr]:
			c, err := m.runtime.Inspect(ctx, id)
			if err == nil && (c.State == ContainerRunning || c.State == ContainerPaused) {
				if err = m.bindPort(ctx, id, addr, c); err == nil {
					n++
				}
			}
			if err != nil && ctx.Err() == nil {
				m.log.Warn("binding a sandbox to its bridge port", zap.String("id", id), zap.Error(err))
			}
		case !want && bound[addr]:
			m.unbindPort(id, addr)
		}
		unlock()
	}
	return n, nil
}

// wantsBinding reports whether sandbox (or pool container) id runs or is
// paused: by the state mirror, or, when fresh, by its record read again.
func (m *Manager) wantsBinding(id string, fresh bool) bool {
	if m.pool.held(id) {
		return true
	}
	var s State
	if fresh {
		rec, err := m.store.Get(id)
		if err != nil {
			return false
		}
		s = rec.State
	} else {
		m.mu.Lock()
		s = m.states[id]
		m.mu.Unlock()
	}
	return s == Running || s == Paused || s == Creating
}
