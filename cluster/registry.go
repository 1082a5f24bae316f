package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/lifecycle"
)

// runRegistry keeps the node registered: a lease of LeaseTTL, kept alive,
// and nodes/<node> on it, re-put every TTL/3 with fresh capacity figures.
// When the lease is lost (keepalive channel closed, lease not found) it
// grants a new one and registers again. first is closed after the first
// attempt.
func (c *Cluster) runRegistry(first chan struct{}) {
	defer c.wg.Done()
	var id leaseID
	c.retryLoop("registering the node", first, func() (err error) {
		id, err = c.register()
		return err
	}, func() bool {
		c.keepRegistered(id)
		return c.ctx.Err() == nil
	})
}

// register grants a lease and puts the node's key on it.
func (c *Cluster) register() (leaseID, error) {
	var lease leaseID
	err := c.call(c.ctx, "granting the node's lease", func(ctx context.Context) (err error) {
		lease, err = c.st.Grant(ctx, c.cfg.LeaseTTL)
		return err
	})
	if err != nil {
		return 0, err
	}
	if err := c.putNode(lease); err != nil {
		return 0, err
	}
	c.lease.Store(int64(lease))
	c.log.Info("node registered", zap.String("node", c.cfg.Node), zap.Duration("lease_ttl", c.cfg.LeaseTTL))
	return lease, nil
}

// putNode writes the node's registration with its current capacity on
// lease id.
func (c *Cluster) putNode(id leaseID) error {
	data, err := json.Marshal(nodeRecord{
		Name:      c.cfg.Node,
		Advertise: c.cfg.Advertise,
		Capacity:  c.src.Capacity(),
		// The current certificate: a renewed one (a reload) is published
		// with the next refresh.
		Certs:     c.cfg.Peers.Current().Cert.Certificate,
		UpdatedAt: c.now().UTC(),
	})
	if err != nil {
		return fmt.Errorf("encoding the node's registration: %w", err)
	}
	return c.call(c.ctx, "registering node "+c.cfg.Node, func(ctx context.Context) error {
		return c.st.PutLeased(ctx, c.nodeKey(c.cfg.Node), data, id)
	})
}

// keepRegistered keeps lease id alive until it is lost or the cluster
// closes, refreshing the registration every TTL/3.
func (c *Cluster) keepRegistered(id leaseID) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	lost, err := c.st.KeepAlive(ctx, id)
	if err != nil {
		c.log.Warn("keeping the node's lease alive", zap.Error(err))
		return
	}
	tick := time.NewTicker(c.cfg.LeaseTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lost:
			if c.ctx.Err() == nil {
				c.log.Warn("node lease lost; registering again", zap.Int64("lease", int64(id)))
			}
			c.lease.CompareAndSwap(int64(id), 0)
			return
		// A keepalive says nothing of Health: etcd renews leases while it
		// refuses every write (out of space), and clearing Health there
		// would flap it against the failing writes. The refresh below
		// clears it when writes work.
		case <-tick.C:
			err := c.putNode(id)
			if errors.Is(err, errLeaseLost) {
				c.log.Warn("node lease expired; registering again", zap.Int64("lease", int64(id)))
				c.lease.CompareAndSwap(int64(id), 0)
				return
			}
		}
	}
}

// Node returns a node's registry entry from memory; Live is false when its
// lease is gone.
func (c *Cluster) Node(name string) (NodeInfo, bool) {
	c.cache.mu.RLock()
	defer c.cache.mu.RUnlock()
	return c.cache.node(name)
}

// node builds name's NodeInfo (read lock held).
func (cat *catalog) node(name string) (NodeInfo, bool) {
	info, live := cat.live[name]
	if !live {
		info = cat.seen[name]
	}
	info.Name = name
	info.Live = live
	info.Draining = cat.drain[name]
	info.Sandboxes = cat.counts[name]
	return info, live || info.Draining || info.Sandboxes > 0
}

// Nodes returns every known node (live, or named by the catalog or a drain
// mark), sorted by name.
func (c *Cluster) Nodes() []NodeInfo {
	c.cache.mu.RLock()
	defer c.cache.mu.RUnlock()
	names := map[string]bool{}
	for n := range c.cache.live {
		names[n] = true
	}
	for n := range c.cache.drain {
		names[n] = true
	}
	for n := range c.cache.counts {
		if n != "" {
			names[n] = true
		}
	}
	out := make([]NodeInfo, 0, len(names))
	for n := range names {
		info, _ := c.cache.node(n)
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b NodeInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// drainMark is the value of drain/<node>.
type drainMark struct {
	Since time.Time `json:"since"`
	By    string    `json:"by"`
}

// Drain sets or clears node's draining mark.
func (c *Cluster) Drain(ctx context.Context, node string, on bool) error {
	if _, known := c.Node(node); !known && on {
		return fmt.Errorf("draining node %s: %w", node, ErrUnknownNode)
	}
	if !on {
		return c.call(ctx, "clearing the drain mark of node "+node, func(ctx context.Context) error {
			return c.st.Delete(ctx, c.drainKey(node))
		})
	}
	data, err := json.Marshal(drainMark{Since: c.now().UTC(), By: c.cfg.Node})
	if err != nil {
		return fmt.Errorf("encoding the drain mark: %w", err)
	}
	return c.call(ctx, "draining node "+node, func(ctx context.Context) error {
		return c.st.Put(ctx, c.drainKey(node), data)
	})
}

// ReasonNodeRemoved is the reason of the entries Remove marks killed.
const ReasonNodeRemoved = "node_removed"

// Remove forgets a node that is gone for good: its registry entry and
// drain mark are deleted and its catalog entries marked killed (reason
// "node_removed"). A live node cannot be removed.
func (c *Cluster) Remove(ctx context.Context, node string) (killed int, err error) {
	// Ask etcd, not the cache: removing a node that is alive would
	// declare its running sandboxes lost.
	var keys []kv
	err = c.callRead(ctx, "looking up node "+node, func(ctx context.Context) (err error) {
		keys, err = c.st.Get(ctx, c.nodeKey(node), c.drainKey(node))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("removing node %s: %w", node, err)
	}
	reg, drain := keys[0], keys[1]
	var entries []kv
	_, err = c.list("reading the catalog for node "+node, c.sandboxesPrefix(), func(kvs []kv) { entries = append(entries, kvs...) })
	if err != nil {
		return 0, fmt.Errorf("removing node %s: %w", node, err)
	}
	if reg.Rev != 0 {
		return 0, fmt.Errorf("removing node %s: the node is live (its lease is held); stop it first, or wait up to %s for its lease to expire", node, c.cfg.LeaseTTL)
	}
	var mine []Entry
	for _, kv := range entries {
		id := strings.TrimPrefix(kv.Key, c.sandboxesPrefix())
		e, derr := c.decodeEntry(id, kv)
		if derr == nil && e.Node == node {
			mine = append(mine, e)
		}
	}
	if len(mine) == 0 && drain.Rev == 0 {
		if _, known := c.Node(node); !known {
			return 0, fmt.Errorf("removing node %s: %w", node, ErrUnknownNode)
		}
	}
	now := c.now().UTC()
	for _, e := range mine {
		guess := e
		// Only while the node stays gone: one that registers again after
		// the check above runs these sandboxes, and its republish (done at
		// its start) would not undo the mark.
		changed, err := c.updateEntryUnless(ctx, "marking sandbox "+e.ID+" of removed node "+node+" killed", e.ID, c.nodeKey(node), &guess,
			func(cur *Entry) (*Entry, bool) {
				if cur == nil || cur.Node != node || (cur.State == lifecycle.Killed && cur.Reason == ReasonNodeRemoved) {
					return nil, false
				}
				next := *cur
				next.State = lifecycle.Killed
				next.Reason = ReasonNodeRemoved
				next.UpdatedAt = now
				return &next, false
			})
		if errors.Is(err, errKeyExists) {
			return killed, fmt.Errorf("removing node %s: the node registered again (it is live and restores the %d entries marked before)", node, killed)
		}
		if err != nil {
			return killed, fmt.Errorf("removing node %s: %w", node, err)
		}
		if changed {
			killed++
		}
	}
	err = c.call(ctx, "removing node "+node, func(ctx context.Context) error {
		return c.st.Delete(ctx, c.drainKey(node))
	})
	if err != nil {
		return killed, fmt.Errorf("removing node %s: %w", node, err)
	}
	c.cache.mu.Lock()
	delete(c.cache.seen, node)
	c.cache.mu.Unlock()
	c.log.Info("node removed", zap.String("node", node), zap.Int("sandboxes_killed", killed))
	return killed, nil
}

// Forget deletes the catalog entry of a sandbox whose node was removed
// (state killed, reason node_removed) while that node still holds no
// lease, so that the id can be destroyed from any gateway and created
// again. It reports whether it deleted the entry; any other entry (a live
// node's, one not marked removed, one whose node registered again
// meanwhile) is left alone with false and no error.
func (c *Cluster) Forget(ctx context.Context, id string) (bool, error) {
	guess := c.cachedOrNil(id)
	if guess == nil || guess.State != lifecycle.Killed || guess.Reason != ReasonNodeRemoved {
		return false, nil
	}
	node := guess.Node
	deleted, err := c.updateEntryUnless(ctx, "forgetting sandbox "+id+" of removed node "+node, id, c.nodeKey(node), guess,
		func(cur *Entry) (*Entry, bool) {
			return nil, cur != nil && cur.Node == node && cur.State == lifecycle.Killed && cur.Reason == ReasonNodeRemoved
		})
	if errors.Is(err, errKeyExists) {
		return false, nil // the node is back: its sandboxes are its again
	}
	if err != nil {
		return false, err
	}
	if deleted {
		c.log.Info("sandbox of a removed node forgotten", zap.String("id", id), zap.String("node", node))
	}
	return deleted, nil
}
