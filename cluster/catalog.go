package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The key spaces under the prefix.
const (
	nodesDir     = "nodes/"
	drainDir     = "drain/"
	sandboxesDir = "sandboxes/"
)

// catalog is the node's in-memory copy of everything under the prefix:
// sandbox entries, registered (live) nodes and drain marks. One watch
// keeps it current. Writers hold mu; the request path reads index only
// (Lookup: no lock, no allocation, no etcd call).
type catalog struct {
	mu sync.RWMutex
	// entries holds each entry once; an entry is never modified once
	// stored (a change stores a new one).
	entries map[string]*Entry
	// index mirrors entries (the same pointers) for Lookup; it is written
	// under mu, in the same order. A catalog being loaded has none
	// (noIndex): its changes are applied to the live index at the end.
	index   sync.Map
	noIndex bool
	// names interns the few distinct strings entries repeat (node names,
	// states, reasons, access): a million entries on three nodes hold
	// three node names, not a million copies.
	names *interner
	// live are the nodes whose lease-bound key exists.
	live map[string]NodeInfo
	// seen keeps the last registration of every node ever live here, so a
	// lost node still shows its addresses.
	seen  map[string]NodeInfo
	drain map[string]bool
	// ignored are the node registrations routing and placement ignore,
	// with why (each reason is logged once).
	ignored map[string]string
	// counts is how many entries name each node.
	counts map[string]int
}

func (cat *catalog) init() {
	cat.entries = map[string]*Entry{}
	if cat.names == nil {
		cat.names = new(interner)
	}
	cat.live = map[string]NodeInfo{}
	cat.seen = map[string]NodeInfo{}
	cat.drain = map[string]bool{}
	cat.ignored = map[string]string{}
	cat.counts = map[string]int{}
}

// nodeRecord is what a node writes under nodes/<node>: NodeInfo without
// what others derive (liveness, drain mark, sandbox count).
type nodeRecord struct {
	Name      string   `json:"name"`
	Advertise string   `json:"advertise"`
	Capacity  Capacity `json:"capacity"`
	// Certs is the node's certificate chain (DER, leaf first), which
	// others check before they count the registration.
	Certs     [][]byte  `json:"certs"`
	UpdatedAt time.Time `json:"updated_at"`
}

func (c *Cluster) sandboxKey(id string) string { return c.cfg.Prefix + sandboxesDir + id }
func (c *Cluster) nodeKey(node string) string  { return c.cfg.Prefix + nodesDir + node }
func (c *Cluster) drainKey(node string) string { return c.cfg.Prefix + drainDir + node }
func (c *Cluster) sandboxesPrefix() string     { return c.cfg.Prefix + sandboxesDir }

// Lookup returns the catalog entry of id from memory (no etcd call, no
// allocation): the request path calls it. The entry's Ports and Labels are
// shared with the cache: callers must not modify them.
func (c *Cluster) Lookup(id string) (Entry, bool) {
	v, ok := c.cache.index.Load(id)
	if !ok {
		return Entry{}, false
	}
	return *v.(*Entry), true
}

// Entries returns the whole catalog from memory, sorted by id.
func (c *Cluster) Entries() []Entry {
	c.cache.mu.RLock()
	out := make([]Entry, 0, len(c.cache.entries))
	for _, e := range c.cache.entries {
		out = append(out, *e)
	}
	c.cache.mu.RUnlock()
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Watch calls fn for every catalog change after it was registered, in
// etcd's order, from the watch goroutine (fn must not block). Several
// functions are called in the order they were registered.
func (c *Cluster) Watch(fn func(Change)) {
	c.subsMu.Lock()
	c.subs = append(c.subs, fn)
	c.subsMu.Unlock()
}

func (c *Cluster) notify(changes []Change) {
	if len(changes) == 0 {
		return
	}
	c.subsMu.Lock()
	subs := c.subs
	c.subsMu.Unlock()
	for _, ch := range changes {
		for _, fn := range subs {
			fn(ch)
		}
	}
}

// runCatalog loads everything under the prefix, then follows it with a
// watch from the next revision; when the watch breaks (compaction, lost
// leader, etcd errors) it loads again. first is closed after the first
// load, whether it worked or not.
func (c *Cluster) runCatalog(first chan struct{}) {
	defer c.wg.Done()
	retry := newRetryDelay(200*time.Millisecond, 3*time.Second)
	for c.ctx.Err() == nil {
		rev, err := c.loadCatalog()
		if first != nil {
			close(first)
			first = nil
		}
		if err != nil {
			c.log.Debug("loading the catalog", zap.Error(err))
			if !sleep(c.ctx, retry.next()) {
				return
			}
			continue
		}
		retry.reset()
		err = c.followCatalog(rev)
		if c.ctx.Err() != nil {
			return
		}
		c.log.Info("catalog watch ended; loading the catalog again", zap.Error(err))
		if !sleep(c.ctx, retry.next()) {
			return
		}
	}
}

// list reads every key under prefix, page by page, all at the revision
// of the first page, and calls fn with each page; it returns that
// revision. Each page is one read under the request timeout, retried
// through a failover (see do): a catalog of a million entries takes longer
// than one request may.
func (c *Cluster) list(what, prefix string, fn func([]kv)) (int64, error) {
	var rev int64
	cont := ""
	for {
		var page []kv
		var at int64
		var next string
		err := c.callRead(c.ctx, what, func(ctx context.Context) (err error) {
			page, at, next, err = c.st.ListPage(ctx, prefix, rev, cont)
			return err
		})
		if err != nil {
			return 0, err
		}
		rev = at
		fn(page)
		if next == "" {
			return rev, nil
		}
		cont = next
	}
}

// loadCatalog replaces the cache with etcd's current content and tells
// the watchers what changed since the cache was last current. It reads in
// pages (getAll).
func (c *Cluster) loadCatalog() (int64, error) {
	fresh := catalog{noIndex: true, names: c.cache.names}
	fresh.init()
	rev, err := c.list("loading the catalog", c.cfg.Prefix, func(kvs []kv) {
		for _, kv := range kvs {
			c.applyTo(&fresh, event{KV: kv})
		}
	})
	if err != nil {
		return 0, err
	}
	cat := &c.cache
	cat.mu.Lock()
	var changes []Change
	var stored []*Entry // the live index's new pointers, as changes[i]
	for id, old := range cat.entries {
		if _, ok := fresh.entries[id]; !ok {
			changes = append(changes, Change{Entry: *old, Deleted: true})
			stored = append(stored, nil)
		}
	}
	for id, e := range fresh.entries {
		if old, ok := cat.entries[id]; !ok || old.Revision != e.Revision {
			changes = append(changes, Change{Entry: *e})
			stored = append(stored, e)
		} else {
			// Unchanged: keep the pointer Lookup's index already holds.
			fresh.entries[id] = old
		}
	}
	fresh.seen = cat.seen
	for name, info := range fresh.live {
		fresh.seen[name] = info
	}
	cat.entries, cat.live, cat.seen, cat.drain, cat.counts, cat.ignored = fresh.entries, fresh.live, fresh.seen, fresh.drain, fresh.counts, fresh.ignored
	for i, ch := range changes {
		if ch.Deleted {
			cat.index.Delete(ch.Entry.ID)
		} else {
			cat.index.Store(ch.Entry.ID, stored[i])
		}
	}
	cat.mu.Unlock()
	slices.SortFunc(changes, func(a, b Change) int { return int(a.Entry.Revision - b.Entry.Revision) })
	// What changed while the catalog was not watched is compared with the
	// records as a whole: entries forged or put back meanwhile are
	// written back.
	c.pub.needResync()
	c.reclaim(changes)
	c.notify(changes)
	return rev, nil
}

// followCatalog applies the watch's events after revision rev until the
// watch ends, and returns why it ended.
func (c *Cluster) followCatalog(rev int64) error {
	err := c.st.Watch(c.ctx, c.cfg.Prefix, rev, func(evs []event) {
		var changes []Change
		c.cache.mu.Lock()
		for _, ev := range evs {
			if ch, ok := c.applyTo(&c.cache, ev); ok {
				changes = append(changes, ch)
			}
		}
		c.cache.mu.Unlock()
		c.reclaim(changes)
		c.notify(changes)
	})
	if err != nil && c.ctx.Err() == nil && !errors.Is(err, errWatchRestart) {
		return c.observe(c.ctx, "watching the catalog", false, err)
	}
	if err != nil && c.ctx.Err() == nil {
		return err
	}
	return c.ctx.Err()
}

// reclaim queues for publishing this node's entries that another node
// marked removed: this node runs (it watches), so its records, not the
// mark, say what those sandboxes are. Remove refuses a live node, but a
// node may register again between that check and the marks, or after
// its start's republish read the catalog.
func (c *Cluster) reclaim(changes []Change) {
	for _, ch := range changes {
		if !ch.Deleted && ch.Entry.Node == c.cfg.Node && ch.Entry.Reason == ReasonNodeRemoved {
			c.Changed(ch.Entry.ID)
		}
	}
}

// applyTo applies one put or delete to cat (locked by the caller) and
// returns the catalog change it makes, if it is a sandbox key.
func (c *Cluster) applyTo(cat *catalog, ev event) (Change, bool) {
	kv, prev := ev.KV, ev.Prev
	rest, ok := strings.CutPrefix(kv.Key, c.cfg.Prefix)
	if !ok {
		return Change{}, false
	}
	put := !ev.Deleted
	switch {
	case strings.HasPrefix(rest, sandboxesDir):
		id := rest[len(sandboxesDir):]
		var old Entry
		oldp, had := cat.entries[id]
		if had {
			old = *oldp
			cat.uncount(old.Node)
		}
		if !put {
			delete(cat.entries, id)
			if !cat.noIndex {
				cat.index.Delete(id)
			}
			if !cat.noIndex {
				c.pub.check(id) // a record of this node's puts it back
			}
			if !had && prev != nil {
				old, _ = c.decodeEntry(id, *prev)
			}
			old.ID = id
			old.Revision = kv.Rev
			return Change{Entry: old, Deleted: true}, true
		}
		e, err := c.decodeEntry(id, kv)
		if err != nil {
			// Ignored, as if absent: nobody routes to it, lists it or
			// shows its events. Its owner writes it back.
			c.log.Warn("ignoring a catalog entry", zap.Error(err))
			// No change is told: the sandbox did not go, and its
			// owner's repair brings the entry back as it was.
			if had {
				delete(cat.entries, id)
				if !cat.noIndex {
					cat.index.Delete(id)
				}
			}
			if !cat.noIndex {
				// Checked only once the entry is out of the index, which
				// the publisher reads without the cache's lock: a check
				// that ran first would find the entry as it was before
				// the forgery, take it as current and write nothing.
				c.pub.check(id)
			}
			return Change{}, false
		}
		cat.names.entry(&e)
		cat.entries[id] = &e
		if !cat.noIndex {
			cat.index.Store(id, &e)
		}
		if e.Node == c.cfg.Node && !cat.noIndex {
			// This node's entry, as the watch saw it (and now cached):
			// checked against its record (an older entry put back, an
			// entry of a sandbox this node no longer holds). A load asks
			// for a full republish instead (loadCatalog).
			c.pub.check(id)
		}
		cat.counts[e.Node]++
		if !had && !cat.noIndex {
			// A new sandbox on e.Node: the catalog counts it now, so a
			// placement of this node's there is no longer in flight.
			c.placed.arrived(e.Node)
		}
		return Change{Entry: e}, true
	case strings.HasPrefix(rest, nodesDir):
		name := rest[len(nodesDir):]
		if !put {
			delete(cat.live, name)
			delete(cat.ignored, name)
			return Change{}, false
		}
		rec, err := c.checkRegistration(name, kv)
		if err != nil {
			// Routing and placement ignore it: nobody is sent there.
			if cat.ignored[name] != err.Error() {
				c.log.Warn("ignoring a node registration", zap.String("node", name), zap.Error(err))
			}
			cat.ignored[name] = err.Error()
			delete(cat.live, name)
			return Change{}, false
		}
		delete(cat.ignored, name)
		info := NodeInfo{
			Name: name, Advertise: rec.Advertise,
			Capacity: rec.Capacity.bounded(), UpdatedAt: rec.UpdatedAt,
		}
		cat.live[name] = info
		cat.seen[name] = info
	case strings.HasPrefix(rest, drainDir):
		name := rest[len(drainDir):]
		if put {
			cat.drain[name] = true
		} else {
			delete(cat.drain, name)
		}
	}
	return Change{}, false
}

// checkRegistration decodes node name's registration and says why it must
// be ignored, if it must. A node holds its key with its lease: one without
// a lease was written by someone else (it would count as live for ever).
// A node publishes its certificate with it: one that the cluster's CA did
// not issue to that node for its advertised host was not written by that
// node, or names an address where another could answer for it.
func (c *Cluster) checkRegistration(name string, kv kv) (nodeRecord, error) {
	if !kv.Leased {
		return nodeRecord{}, errors.New("no lease (not written by a node)")
	}
	var rec nodeRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return nodeRecord{}, fmt.Errorf("malformed: %w", err)
	}
	host, _, err := net.SplitHostPort(rec.Advertise)
	if err != nil || host == "" {
		return nodeRecord{}, fmt.Errorf("advertise %q is not host:port", rec.Advertise)
	}
	if err := c.cfg.Peers.verifyRegistration(rec.Certs, name, host); err != nil {
		return nodeRecord{}, fmt.Errorf("its certificate: %w", err)
	}
	return rec, nil
}

// interner hands out one copy of each string it is given.
type interner struct {
	mu sync.Mutex
	m  map[string]string
}

// entry interns e's repeated strings.
func (in *interner) entry(e *Entry) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.m == nil {
		in.m = map[string]string{}
	}
	for _, s := range []*string{&e.Node, (*string)(&e.State), &e.Reason, &e.Access} {
		if *s == "" {
			continue
		}
		if v, ok := in.m[*s]; ok {
			*s = v
		} else if len(in.m) < 4096 {
			// Bounded: node names and states are few; anything else
			// (a malformed catalog) is left as it is.
			in.m[*s] = *s
		}
	}
}

func (cat *catalog) uncount(node string) {
	if cat.counts[node] <= 1 {
		delete(cat.counts, node)
	} else {
		cat.counts[node]--
	}
}

func (cat *catalog) liveNodes() int {
	cat.mu.RLock()
	defer cat.mu.RUnlock()
	return len(cat.live)
}

// cached returns the cached entry of id, if any.
func (c *Cluster) cached(id string) (*Entry, bool) {
	e, ok := c.Lookup(id)
	if !ok {
		return nil, false
	}
	return &e, true
}
