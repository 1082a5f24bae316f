package gateway

import (
	"errors"
	"fmt"
	"sync/atomic"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/sandwake/sandwake/lifecycle"
)

// routeCacheSize bounds the route cache; sandboxes beyond it are read from the
// store on a miss (a read, never a write).
const routeCacheSize = 16384

// Route is what the request path needs to know of one sandbox, built from its
// record once and kept until the sandbox's next event.
type Route struct {
	ID     string
	State  lifecycle.State
	Access string
	// Cards says whether the request path reads and serves the sandbox's
	// link card: a public sandbox, or a private one with public_card.
	Cards    bool
	TokenGen uint64
	ports    []int
	// Reason is the record's reason code. The record's error text is left
	// out on purpose: the request path answers anonymous visitors.
	Reason   string
	Activity *lifecycle.Activity
	// Downs is activity.Downs() as it was before the record was read: if it
	// moved on, the sandbox was paused or stopped since and this route is
	// stale (see Activity.Enter).
	Downs uint64
	// Upstreams holds, per declared port, the address handed to
	// reverse_proxy (a pointer, so storing it in the request vars allocates
	// nothing).
	Upstreams map[int]*UpstreamSet
	// Incarnation is the record's incarnation, which preview tokens are
	// bound to besides tokenGen.
	Incarnation string
}

// UpstreamSet is the value stored in the request's vars for the dynamic
// upstream source.
type UpstreamSet struct {
	Dial string
}

// Declares reports whether the sandbox serves port.
func (rt *Route) Declares(port int) bool {
	for _, p := range rt.ports {
		if p == port {
			return true
		}
	}
	return false
}

// RouteCache maps sandbox ids to routes. It is invalidated by the manager's
// event hook, which runs in commit order; gen guards against a reader that
// loaded a record just before an event putting back a stale route.
type RouteCache struct {
	mgr   *lifecycle.Manager
	cache *lru.Cache[string, *Route]
	gen   atomic.Uint64
}

// Len is how many routes are cached.
func (c *RouteCache) Len() int { return c.cache.Len() }

// NewRouteCache is an empty cache of mgr's routes.
func NewRouteCache(mgr *lifecycle.Manager) *RouteCache {
	c, _ := lru.New[string, *Route](routeCacheSize) // only fails for size <= 0
	return &RouteCache{mgr: mgr, cache: c}
}

// absent is the cached route of a sandbox this node does not hold (see
// Holds).
var absent = &Route{}

// Holds reports whether this node holds sandbox id. An id it does not hold
// is remembered until its next event (a create here is one), so that a
// request forwarded to another node reads the store once, not every time.
func (c *RouteCache) Holds(id string) bool {
	if rt, ok := c.cache.Get(id); ok {
		return rt != absent
	}
	gen := c.gen.Load()
	_, err := c.Get(id)
	if errors.Is(err, lifecycle.ErrNotFound) && c.gen.Load() == gen {
		c.cache.Add(id, absent)
	}
	return err == nil
}

// Get returns sandbox id's route, reading the store on a miss.
func (c *RouteCache) Get(id string) (*Route, error) {
	if rt, ok := c.cache.Get(id); ok {
		if rt == absent {
			return nil, fmt.Errorf("sandbox %s: %w", id, lifecycle.ErrNotFound)
		}
		return rt, nil
	}
	gen := c.gen.Load()
	// downs is read before the record (see route.downs), the tracker made
	// only for an id that exists: unknown ids must leave nothing behind.
	downs := c.mgr.Downs(id)
	rec, err := c.mgr.Get(id)
	if err != nil {
		return nil, err
	}
	act := c.mgr.Activity(id)
	rt := &Route{
		ID:        id,
		State:     rec.State,
		Access:    rec.Spec.Access,
		Cards:     rec.Spec.Access != lifecycle.AccessPrivate || rec.Spec.PublicCard,
		TokenGen:  rec.TokenGeneration,
		ports:     rec.Spec.Ports,
		Reason:    rec.Reason,
		Activity:  act,
		Downs:     downs,
		Upstreams: make(map[int]*UpstreamSet, len(rec.Upstreams)),

		Incarnation: rec.Incarnation,
	}
	for port, addr := range rec.Upstreams {
		rt.Upstreams[port] = &UpstreamSet{Dial: addr}
	}
	if c.gen.Load() == gen {
		c.cache.Add(id, rt)
	}
	return rt, nil
}

// invalidate drops a sandbox's route after its record changed.
func (c *RouteCache) invalidate(id string) {
	c.gen.Add(1)
	c.cache.Remove(id)
}
