package lifecycle

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// This file follows the networks the engine removes. The firewall's tables
// of a network die with it (StaleRemover), whichever instance's it was:
// removed behind a stopped gateway's back, its tables are left for the
// next gateway on the host to notice. This gateway's own network, removed
// while it runs, is made again (with its tables) by the next create, wake
// or reconcile.

// NetworkEventSource is implemented by runtimes that report the networks
// the engine removes.
type NetworkEventSource interface {
	// NetworkRemovals streams the names of the networks the engine
	// removes (any, not only the runtime's) until ctx ends or the stream
	// breaks (an error is sent, then both channels are done).
	NetworkRemovals(ctx context.Context) (<-chan string, <-chan error)
}

// StaleRemover is implemented by firewalls that remove what they installed
// for networks that are gone.
type StaleRemover interface {
	// RemoveStale removes the tables of every sandbox network that is
	// gone, and answers their names.
	RemoveStale() ([]string, error)
}

// runNetworkEvents follows the engine's network removals until the manager
// closes, resubscribing with backoff when the stream breaks; each
// subscription starts with a sweep, for the removals missed meanwhile.
func (m *Manager) runNetworkEvents(src NetworkEventSource) {
	backoff := 100 * time.Millisecond
	for m.ctx.Err() == nil {
		ctx, cancel := context.WithCancel(m.ctx)
		names, errs := src.NetworkRemovals(ctx)
		m.removeStaleTables()
	stream:
		for {
			select {
			case <-m.ctx.Done():
				cancel()
				return
			case name, ok := <-names:
				if !ok {
					break stream
				}
				backoff = 100 * time.Millisecond
				m.networkRemoved(name)
				// A burst (a host's networks pruned) is one sweep.
				for drained := false; !drained; {
					select {
					case name, ok := <-names:
						if ok {
							m.networkRemoved(name)
						} else {
							drained = true // the outer receive sees it closed
						}
					default:
						drained = true
					}
				}
				m.removeStaleTables()
			case err := <-errs:
				if err != nil && m.ctx.Err() == nil {
					m.log.Warn("engine network event stream broke; resubscribing", zap.Error(err), zap.Duration("after", backoff))
				}
				break stream
			}
		}
		cancel()
		if !m.backOff(&backoff) {
			return
		}
	}
}

// networkRemoved forgets the sandbox network when name is it: the next
// create, wake or reconcile makes it again and sets its firewall up anew,
// rather than trusting a network (its subnet, its tables) that is gone.
func (m *Manager) networkRemoved(name string) {
	m.netMu.Lock()
	defer m.netMu.Unlock()
	if m.net != nil && m.net.Name == name {
		m.log.Warn("the sandbox network was removed behind the gateway's back: made again at the next create, wake or reconcile", zap.String("network", name))
		m.net = nil
	}
}

// removeStaleTables has the firewall remove the tables of networks that are
// gone (a firewall that cannot, or none, does nothing).
func (m *Manager) removeStaleTables() {
	sr, ok := m.built.Firewall.(StaleRemover)
	if !ok {
		return
	}
	if _, err := sr.RemoveStale(); err != nil && m.ctx.Err() == nil {
		m.log.Warn("removing the firewall tables of removed networks", zap.Error(err))
	}
}
