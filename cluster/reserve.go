package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// Reserve claims id for this node in one etcd transaction (the key must
// not exist): ErrTaken when any node holds it, ErrEtcd when etcd cannot
// answer.
func (c *Cluster) Reserve(ctx context.Context, id string, memoryMB int64) error {
	now := c.reserveTime()
	data, err := c.sealEntry(Entry{
		ID: id, Node: c.cfg.Node, State: lifecycle.Creating,
		MemoryMB: memoryMB, CreatedAt: now, UpdatedAt: now,
	})
	if err != nil {
		return fmt.Errorf("reserving id %s: %w", id, err)
	}
	key := c.sandboxKey(id)
	// Marked before the transaction: a republish running meanwhile must
	// not take the fresh entry, which has no local record yet, for stale.
	c.pub.reserve(id)
	// The transaction runs to its answer even when the caller gives up
	// (each try is bounded by the request timeout): a reservation etcd
	// applied after the caller's context ended would otherwise be reported
	// as failed, never released, and hold the id until the next republish.
	var res swapResult
	err = c.call(context.WithoutCancel(ctx), "reserving id "+id, func(ctx context.Context) (err error) {
		res, err = c.st.Swap(ctx, key, 0, swapPut, data, "")
		return err
	})
	if err != nil {
		c.pub.unreserve(id, false)
		return err
	}
	if res.Succeeded {
		return nil
	}
	cur := res.Cur
	if cur.Rev != 0 && bytes.Equal(cur.Value, data) {
		// A first try that the store applied but did not confirm (see
		// call): the value is this very call's, its time unique to it.
		return nil
	}
	if cur.Rev != 0 && c.takeStale(ctx, id, cur, data) {
		return nil
	}
	c.pub.unreserve(id, false)
	owner := "another node"
	if cur.Rev != 0 {
		if e, err := c.decodeEntry(id, cur); err == nil && e.Node != "" {
			owner = "node " + e.Node
		}
	}
	return fmt.Errorf("reserving id %s: %w (held by %s)", id, ErrTaken, owner)
}

// takeStale replaces kv, id's entry, with the reservation data when the
// entry is this node's own and stale: no local record and no other
// reservation of id here. That is a sandbox just destroyed whose entry
// the publisher has not deleted yet; without this, a create of the same id
// right after the destroy is refused as taken by this very node. It
// reports whether the reservation is in place.
func (c *Cluster) takeStale(ctx context.Context, id string, kv kv, data []byte) bool {
	if e, err := c.decodeEntry(id, kv); err != nil || e.Node != c.cfg.Node || c.pub.reservations(id) > 1 {
		return false
	}
	if _, err := c.src.Get(id); !errors.Is(err, lifecycle.ErrNotFound) {
		return false
	}
	key := c.sandboxKey(id)
	// A second round when the publisher's deletion of the stale entry
	// came first (mod revision 0: the key is absent).
	rev := kv.Rev
	for range 2 {
		var res swapResult
		err := c.call(context.WithoutCancel(ctx), "reserving id "+id+" over this node's stale entry", func(ctx context.Context) (err error) {
			res, err = c.st.Swap(ctx, key, rev, swapPut, data, "")
			return err
		})
		if err != nil {
			return false
		}
		if res.Succeeded {
			return true
		}
		if res.Cur.Rev != 0 {
			return bytes.Equal(res.Cur.Value, data)
		}
		rev = 0
	}
	return false
}

// reserveTime is the creation time of a reservation, distinct for every
// call in the process, so that a reservation's value names its call.
func (c *Cluster) reserveTime() time.Time {
	now := c.now().UnixNano()
	for {
		last := c.lastReserve.Load()
		t := max(now, last+1)
		if c.lastReserve.CompareAndSwap(last, t) {
			return time.Unix(0, t).UTC()
		}
	}
}

// Release removes this node's entry of id if it is still this node's (a
// create that failed, a destroy).
func (c *Cluster) Release(ctx context.Context, id string) error {
	// One reservation given back, not all: another create of the same id
	// may be reserving it right now (its transaction lands once this
	// deletion is done), and its count must keep its entry from the
	// republish until its record exists.
	c.pub.unreserve(id, false)
	_, err := c.updateEntry(ctx, "releasing id "+id, id, c.cachedOrNil(id), func(cur *Entry) (*Entry, bool) {
		return nil, cur != nil && cur.Node == c.cfg.Node
	})
	return err
}
