package gateway

import (
	"net/netip"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// maxTrackedClients bounds the clients whose wake budget and held requests
// are remembered: the least recently seen are forgotten first (a client
// forgotten starts again with a full budget, never with less).
const maxTrackedClients = 16384

// ClientLimits are the per-client budgets of the preview path: wakes per
// second and requests held through a wake at once, per client address (an
// IPv6 address counts as its /64; behind trusted proxies, the real
// client). They sit beside the global wake_rate, so that one client cannot
// spend the whole budget.
type ClientLimits struct {
	mu        sync.Mutex
	perSecond float64 // 0: no per-client wake cap
	burst     int
	maxHeld   int // 0: no per-client cap on held requests
	clients   *lru.Cache[netip.Prefix, *clientState]
}

// clientState is one client's wake budget and held requests.
type clientState struct {
	wakes *rate.Limiter // nil: no cap
	held  int
}

// NewClientLimits are budgets with no limits (Configure sets them).
func NewClientLimits() *ClientLimits {
	c, _ := lru.New[netip.Prefix, *clientState](maxTrackedClients)
	return &ClientLimits{clients: c}
}

// Configure applies a config's settings. Budgets already tracked keep
// what they spent; their rate changes.
func (c *ClientLimits) Configure(perSecond float64, burst, maxHeld int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.perSecond, c.burst, c.maxHeld = perSecond, max(burst, 1), maxHeld
	for _, k := range c.clients.Keys() {
		if s, ok := c.clients.Peek(k); ok {
			s.wakes = c.limiter(s.wakes)
		}
	}
}

// limiter is a wake limiter of the current settings, reusing old (nil: a
// new one).
func (c *ClientLimits) limiter(old *rate.Limiter) *rate.Limiter {
	if c.perSecond <= 0 {
		return nil
	}
	if old == nil {
		return rate.NewLimiter(rate.Limit(c.perSecond), c.burst)
	}
	old.SetLimit(rate.Limit(c.perSecond))
	old.SetBurst(c.burst)
	return old
}

// state is client's state, made when new. Called with c.mu held.
func (c *ClientLimits) state(client netip.Prefix) *clientState {
	s, ok := c.clients.Get(client)
	if !ok {
		s = &clientState{wakes: c.limiter(nil)}
		c.clients.Add(client, s)
	}
	return s
}

// reserveWake takes one wake from client's budget. It answers false when
// the client has none left; otherwise a cancel that gives the wake back
// (when a later, global check refuses it).
func (c *ClientLimits) reserveWake(client netip.Prefix, now time.Time) (ok bool, cancel func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state(client)
	if s.wakes == nil {
		return true, func() {}
	}
	r := s.wakes.ReserveN(now, 1)
	if !r.OK() || r.DelayFrom(now) > 0 {
		r.CancelAt(now)
		return false, nil
	}
	return true, func() { r.CancelAt(now) }
}

// Hold counts a request of client held through a wake. It answers false
// when the client already has maxHeld; otherwise a release to call when
// the request is no longer held.
func (c *ClientLimits) Hold(client netip.Prefix) (ok bool, release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state(client)
	if c.maxHeld > 0 && s.held >= c.maxHeld {
		return false, nil
	}
	s.held++
	var once sync.Once
	return true, func() {
		once.Do(func() {
			c.mu.Lock()
			s.held--
			c.mu.Unlock()
		})
	}
}
