package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sandwake/sandwake/lifecycle"
)

// Reserve claims id for this node in one etcd transaction (the key must
// not exist): ErrTaken when any node holds it, ErrEtcd when etcd cannot
// answer.
func (c *Cluster) Reserve(ctx context.Context, id string, memoryMB int64) error {
	now := c.reserveTime()
	data, err := json.Marshal(Entry{
		ID: id, Node: c.cfg.Node, State: lifecycle.Creating,
		MemoryMB: memoryMB, CreatedAt: now, UpdatedAt: now,
	})
	if err != nil {
		return fmt.Errorf("reserving id %s: encoding: %w", id, err)
	}
	key := c.sandboxKey(id)
	// Marked before the transaction: a republish running meanwhile must
	// not take the fresh entry, which has no local record yet, for stale.
	c.pub.reserve(id)
	// The transaction runs to its answer even when the caller gives up
	// (each try is bounded by the request timeout): a reservation etcd
	// applied after the caller's context ended would otherwise be reported
	// as failed, never released, and hold the id until the next republish.
	var resp *clientv3.TxnResponse
	err = c.call(context.WithoutCancel(ctx), "reserving id "+id, func(ctx context.Context) (err error) {
		resp, err = c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(data))).
			Else(clientv3.OpGet(key)).
			Commit()
		return err
	})
	if err != nil {
		c.pub.unreserve(id, false)
		return err
	}
	if resp.Succeeded {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) > 0 && bytes.Equal(kvs[0].Value, data) {
		// A first try that etcd applied but did not confirm (see call):
		// the value is this very call's, its time unique to it.
		return nil
	}
	c.pub.unreserve(id, false)
	owner := "another node"
	if len(kvs) > 0 {
		if e, err := decodeEntry(id, kvs[0]); err == nil && e.Node != "" {
			owner = "node " + e.Node
		}
	}
	return fmt.Errorf("reserving id %s: %w (held by %s)", id, ErrTaken, owner)
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
