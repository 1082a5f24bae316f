package caddymodule

import (
	"sync/atomic"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/sandwake/sandwake/lifecycle"
)

// routeCacheSize bounds the route cache; sandboxes beyond it are read from the
// store on a miss (a read, never a write).
const routeCacheSize = 16384

// route is what the request path needs to know of one sandbox, built from its
// record once and kept until the sandbox's next event.
type route struct {
	id       string
	state    lifecycle.State
	access   string
	tokenGen uint64
	ports    []int
	// reason is the record's reason code. The record's error text is left
	// out on purpose: the request path answers anonymous visitors.
	reason   string
	activity *lifecycle.Activity
	// downs is activity.Downs() as it was before the record was read: if it
	// moved on, the sandbox was paused or stopped since and this route is
	// stale (see Activity.Enter).
	downs uint64
	// upstreams holds, per declared port, the address handed to
	// reverse_proxy (a pointer, so storing it in the request vars allocates
	// nothing).
	upstreams map[int]*upstreamSet
	// incarnation is the record's incarnation, which preview tokens are
	// bound to besides tokenGen.
	incarnation string
}

// upstreamSet is the value stored in the request's vars for the dynamic
// upstream source.
type upstreamSet struct {
	dial string
}

func (rt *route) declares(port int) bool {
	for _, p := range rt.ports {
		if p == port {
			return true
		}
	}
	return false
}

// routeCache maps sandbox ids to routes. It is invalidated by the manager's
// event hook, which runs in commit order; gen guards against a reader that
// loaded a record just before an event putting back a stale route.
type routeCache struct {
	mgr   *lifecycle.Manager
	cache *lru.Cache[string, *route]
	gen   atomic.Uint64
}

func newRouteCache(mgr *lifecycle.Manager) *routeCache {
	c, _ := lru.New[string, *route](routeCacheSize) // only fails for size <= 0
	return &routeCache{mgr: mgr, cache: c}
}

// get returns sandbox id's route, reading the store on a miss.
func (c *routeCache) get(id string) (*route, error) {
	if rt, ok := c.cache.Get(id); ok {
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
	rt := &route{
		id:        id,
		state:     rec.State,
		access:    rec.Spec.Access,
		tokenGen:  rec.TokenGeneration,
		ports:     rec.Spec.Ports,
		reason:    rec.Reason,
		activity:  act,
		downs:     downs,
		upstreams: make(map[int]*upstreamSet, len(rec.Upstreams)),

		incarnation: rec.Incarnation,
	}
	for port, addr := range rec.Upstreams {
		rt.upstreams[port] = &upstreamSet{dial: addr}
	}
	if c.gen.Load() == gen {
		c.cache.Add(id, rt)
	}
	return rt, nil
}

// invalidate drops a sandbox's route after its record changed.
func (c *routeCache) invalidate(id string) {
	c.gen.Add(1)
	c.cache.Remove(id)
}
