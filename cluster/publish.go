package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/lifecycle"
)

// publisher is the queue of local changes waiting to reach the catalog.
// It holds ids only: the node's Badger records are the durable queue, so
// a change lost with the process is found again by the full republish at
// the next start.
type publisher struct {
	mu sync.Mutex
	// dirty maps each id marked by Changed to when it was first marked;
	// inflight is the batch being published.
	dirty, inflight map[string]time.Time
	// reserved counts the ids this node reserved whose record may not
	// exist yet: neither a republish nor a record-gone publish deletes
	// their entries.
	reserved map[string]int
	// resync asks for a full republish (set at start and after any etcd
	// failure).
	resync bool
	// checks are the ids marked by the catalog watch rather than by a
	// local change: an entry ignored as forged, deleted, or of this node
	// as someone wrote it. A publish that then writes is a repair.
	checks map[string]bool
	wake   chan struct{}
}

func (p *publisher) init() {
	p.dirty = map[string]time.Time{}
	p.inflight = map[string]time.Time{}
	p.reserved = map[string]int{}
	p.checks = map[string]bool{}
	p.resync = true
	p.wake = make(chan struct{}, 1)
}

func (p *publisher) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *publisher) needResync() {
	p.mu.Lock()
	p.resync = true
	p.mu.Unlock()
	p.poke()
}

// pending is how many ids wait and since when the oldest waits. An id
// marked again while its publish is in flight is one id waiting.
func (p *publisher) pending() (int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var oldest time.Time
	n := len(p.dirty)
	for _, m := range []map[string]time.Time{p.dirty, p.inflight} {
		for _, t := range m {
			if oldest.IsZero() || t.Before(oldest) {
				oldest = t
			}
		}
	}
	for id := range p.inflight {
		if _, again := p.dirty[id]; !again {
			n++
		}
	}
	return n, oldest
}

func (p *publisher) isReserved(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reserved[id] > 0
}

// reservations is how many reservations of id are held here.
func (p *publisher) reservations(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reserved[id]
}

func (p *publisher) reserve(id string) {
	p.mu.Lock()
	p.reserved[id]++
	p.mu.Unlock()
}

func (p *publisher) unreserve(id string, all bool) {
	p.mu.Lock()
	if all || p.reserved[id] <= 1 {
		delete(p.reserved, id)
	} else {
		p.reserved[id]--
	}
	p.mu.Unlock()
}

// check marks id for comparing its entry with this node's record, if it
// holds one (the catalog watch calls it; it never blocks).
func (p *publisher) check(id string) {
	p.mu.Lock()
	if _, ok := p.dirty[id]; !ok {
		p.dirty[id] = time.Now()
	}
	p.checks[id] = true
	p.mu.Unlock()
	p.poke()
}

// Changed marks sandbox id for publishing (the Manager's OnChange hook);
// it never blocks and never touches the network itself.
func (c *Cluster) Changed(id string) {
	p := &c.pub
	p.mu.Lock()
	if _, ok := p.dirty[id]; !ok {
		p.dirty[id] = c.now()
	}
	p.mu.Unlock()
	p.poke()
}

// runPublisher publishes marked ids one after the other, and everything
// when a resync is due; on an etcd failure it keeps what is left and
// retries with backoff. first is closed after the first round.
func (c *Cluster) runPublisher(first chan struct{}) {
	defer c.wg.Done()
	c.retryLoop("publishing to the catalog", first, c.publishRound, func() bool {
		select {
		case <-c.pub.wake:
			return true
		case <-c.ctx.Done():
			return false
		}
	})
}

// publishRound runs a due republish, then publishes the marked ids.
func (c *Cluster) publishRound() error {
	p := &c.pub
	p.mu.Lock()
	resync := p.resync
	p.resync = false
	p.mu.Unlock()
	if resync {
		if err := c.republish(); err != nil {
			p.mu.Lock()
			p.resync = true
			p.mu.Unlock()
			return err
		}
	}
	p.mu.Lock()
	p.inflight, p.dirty = p.dirty, p.inflight
	ids := make([]string, 0, len(p.inflight))
	for id := range p.inflight {
		ids = append(ids, id)
	}
	checks := p.checks
	p.checks = map[string]bool{}
	p.mu.Unlock()
	var err error
	for i, id := range ids {
		var wrote bool
		if wrote, err = c.publish(id); err != nil {
			ids = ids[i:]
			break
		}
		if wrote && checks[id] {
			c.repairs.Add(1)
			c.log.Warn("catalog entry differed from this node's record: written back", zap.String("id", id))
		}
	}
	p.mu.Lock()
	if err != nil {
		// Keep the unpublished ids with their first-marked time.
		for _, id := range ids {
			if t, ok := p.dirty[id]; !ok || p.inflight[id].Before(t) {
				p.dirty[id] = p.inflight[id]
			}
		}
	}
	clear(p.inflight)
	p.mu.Unlock()
	return err
}

// entryOf is the catalog entry of a local record.
func (c *Cluster) entryOf(r lifecycle.Record) Entry {
	return Entry{
		ID:              r.ID,
		Node:            c.cfg.Node,
		State:           r.State,
		Reason:          r.Reason,
		Ports:           r.Spec.Ports,
		Access:          r.Spec.Access,
		Incarnation:     r.Incarnation,
		TokenGeneration: r.TokenGeneration,
		MemoryMB:        r.Spec.GroupMemoryMB(),
		Labels:          r.Spec.Labels,
		CreatedAt:       r.CreatedAt,
		// The entry changes with the record's state, not with the time it
		// is published, so an unchanged record republishes as a no-op.
		UpdatedAt: r.StateSince,
	}
}

// publish brings id's catalog entry in line with the local record and
// reports whether it wrote to etcd.
func (c *Cluster) publish(id string) (bool, error) {
	rec, err := c.src.Get(id)
	switch {
	case errors.Is(err, lifecycle.ErrNotFound):
		return c.unpublish(id, c.cachedOrNil(id))
	case err != nil:
		// A record that cannot be read cannot be published; a republish
		// (which lists the records rather than reading this one) is asked
		// for and catches it up. Holding the queue for it would stop
		// every other change.
		c.log.Error("reading a record to publish", zap.String("id", id), zap.Error(err))
		c.pub.needResync()
		return false, nil
	}
	c.pub.unreserve(id, true)
	return c.put(c.entryOf(rec), c.cachedOrNil(id))
}

func (c *Cluster) cachedOrNil(id string) *Entry {
	e, _ := c.cached(id)
	return e
}

// put writes want unless another node holds the id in a signed entry
// (logged, never overwritten: that node either holds a record of it too,
// or deletes the entry when its watch shows it one it does not hold) or
// the entry is already so; guess is the entry believed current. A forged
// entry reads as nobody's and is overwritten: this node holds the record.
func (c *Cluster) put(want Entry, guess *Entry) (bool, error) {
	wantJSON, err := c.sealEntry(want)
	if err != nil {
		return false, err
	}
	if c.sameEntry(guess, wantJSON) {
		// As the watch last showed it: any later change of the entry
		// comes through the watch and marks it for a check again.
		return false, nil
	}
	return c.updateEntry(c.ctx, "publishing sandbox "+want.ID, want.ID, guess, func(cur *Entry) (*Entry, bool) {
		if cur != nil && cur.Node != "" && cur.Node != c.cfg.Node {
			c.log.Warn("not publishing a sandbox whose id another node holds in the catalog",
				zap.String("id", want.ID), zap.String("owner", cur.Node))
			return nil, false
		}
		if c.sameEntry(cur, wantJSON) {
			return nil, false
		}
		return &want, false
	})
}

// sameEntry reports whether cur (nil: none) is the entry encoded (and
// signed) as want.
func (c *Cluster) sameEntry(cur *Entry, want []byte) bool {
	if cur == nil || cur.Sig == "" {
		return false
	}
	curJSON, err := json.Marshal(cur)
	return err == nil && bytes.Equal(curJSON, want)
}

// unpublish deletes id's entry if it is this node's and not a reservation.
func (c *Cluster) unpublish(id string, guess *Entry) (bool, error) {
	if c.pub.isReserved(id) {
		return false, nil
	}
	return c.updateEntry(c.ctx, "unpublishing sandbox "+id, id, guess, func(cur *Entry) (*Entry, bool) {
		return nil, cur != nil && cur.Node == c.cfg.Node
	})
}

// republish compares every local record with etcd's entries of this node:
// missing and different entries are put, this node's entries without a
// record deleted.
func (c *Cluster) republish() error {
	recs, err := c.src.List("")
	if err != nil {
		// Nothing to compare with; etcd is not at fault (Health stays),
		// but the republish stays due and is tried again with backoff:
		// dropped, it would wait for the next etcd failure or restart,
		// and the catalog would miss every record meanwhile.
		c.log.Error("listing local records to republish", zap.Error(err))
		return fmt.Errorf("listing local records to republish: %w", err)
	}
	local := make(map[string]bool, len(recs))
	for _, r := range recs {
		local[r.ID] = true
	}
	// Kept: the entries of this node's records and those naming this
	// node; a million others are compared with nothing here.
	inEtcd := map[string]*Entry{}
	_, err = c.list("reading the catalog to republish", c.sandboxesPrefix(), func(kvs []kv) {
		for _, kv := range kvs {
			id := strings.TrimPrefix(kv.Key, c.sandboxesPrefix())
			e, _ := c.decodeEntry(id, kv)
			if local[id] || e.Node == c.cfg.Node {
				inEtcd[id] = &e
			}
		}
	})
	if err != nil {
		return err
	}
	written, deleted := 0, 0
	for _, r := range recs {
		want := c.entryOf(r)
		// The read above is etcd's current state: an entry already so
		// needs no transaction (a republish after every etcd hiccup would
		// otherwise cost one round trip per sandbox). A change after the
		// read is a publish of its own.
		if cur := inEtcd[r.ID]; cur != nil && cur.Node == c.cfg.Node {
			if wantJSON, err := c.sealEntry(want); err == nil && c.sameEntry(cur, wantJSON) {
				continue
			}
		}
		changed, err := c.put(want, inEtcd[r.ID])
		if err != nil {
			return err
		}
		if changed {
			written++
		}
	}
	var stale []string
	for id, e := range inEtcd {
		if e.Node == c.cfg.Node && !local[id] {
			stale = append(stale, id)
		}
	}
	slices.Sort(stale)
	for _, id := range stale {
		changed, err := c.unpublish(id, inEtcd[id])
		if err != nil {
			return err
		}
		if changed {
			deleted++
		}
	}
	c.log.Info("catalog republished", zap.Int("records", len(recs)), zap.Int("written", written), zap.Int("stale_deleted", deleted))
	return nil
}

// maxCASAttempts bounds the compare-and-set loop of one entry.
const maxCASAttempts = 8

// updateEntry changes id's entry by compare-and-set: decide sees the
// current entry (nil: none) and returns the entry to put, or del to delete
// it, or neither to leave it. guess is the entry believed current (nil:
// none); when etcd has another revision, decide runs again on etcd's. It
// reports whether it wrote.
func (c *Cluster) updateEntry(ctx context.Context, what, id string, guess *Entry, decide func(cur *Entry) (next *Entry, del bool)) (bool, error) {
	return c.updateEntryUnless(ctx, what, id, "", guess, decide)
}

// errKeyExists is updateEntryUnless's refusal: the key that had to be
// absent exists.
var errKeyExists = errors.New("key exists")

// updateEntryUnless is updateEntry that writes only while key absent does
// not exist (none when empty), in the same transaction; it fails with
// errKeyExists when it does.
func (c *Cluster) updateEntryUnless(ctx context.Context, what, id, absent string, guess *Entry, decide func(cur *Entry) (next *Entry, del bool)) (bool, error) {
	key := c.sandboxKey(id)
	cur := guess
	for range maxCASAttempts {
		rev := int64(0)
		if cur != nil {
			rev = cur.Revision
		}
		next, del := decide(cur)
		op, value := swapNone, []byte(nil)
		switch {
		case next != nil:
			data, err := c.sealEntry(*next)
			if err != nil {
				return false, fmt.Errorf("%s: %w", what, err)
			}
			op, value = swapPut, data
		case del:
			op = swapDelete
		}
		var res swapResult
		// A swap without an operation only reads (etcd answers it even
		// when it refuses writes).
		err := c.do(ctx, what, op != swapNone, func(ctx context.Context) (err error) {
			res, err = c.st.Swap(ctx, key, rev, op, value, absent)
			return err
		})
		if err != nil {
			return false, err
		}
		if res.Succeeded {
			return op != swapNone, nil
		}
		if res.AbsentExists {
			return false, fmt.Errorf("%s: %w: %s", what, errKeyExists, absent)
		}
		if res.Cur.Rev == 0 {
			cur = nil
			continue
		}
		e, _ := c.decodeEntry(id, res.Cur)
		cur = &e
	}
	return false, fmt.Errorf("%s: the entry kept changing under %d attempts", what, maxCASAttempts)
}
