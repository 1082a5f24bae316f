package gateway

import (
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// DefaultNoWakeUserAgents are substrings (case-insensitive) of User-Agents
// that never wake a sandbox: search and social crawlers, link previewers and
// uptime monitors, which would otherwise keep every preview awake.
var DefaultNoWakeUserAgents = []string{
	"bot", "crawler", "spider", "slurp", "facebookexternalhit", "embedly",
	"uptimerobot", "pingdom", "statuscake", "site24x7", "kube-probe",
	"elb-healthchecker", "googlehc",
	// Link unfurlers whose User-Agent says none of the above: WhatsApp,
	// Microsoft Teams (SkypeUriPreview), iMessage (facebookexternalhit
	// with Facebot), Mastodon instances.
	"whatsapp", "skypeuripreview", "facebot", "mastodon",
}

// WakeGuard decides whether a request may wake a sandbox: not for crawler
// User-Agents, not faster than a global rate, and not again too soon for a
// sandbox whose wakes keep failing (exponential backoff, reset by an API
// wake or a success).
type WakeGuard struct {
	userAgents []string
	limiter    *rate.Limiter

	mu      sync.Mutex
	backoff map[string]*wakeBackoff
	// admitted holds sandboxes whose wake was let through the rate cap
	// lately: more requests for the same wake join it and take nothing
	// from the cap (the cap counts wakes, not requests).
	admitted map[string]time.Time
}

// admittedFor is how long a wake let through the cap covers later requests
// for the same sandbox (longer than a wake normally takes to register).
const admittedFor = 10 * time.Second

type wakeBackoff struct {
	failures int
	until    time.Time
}

// Backoff of failing wakes: 2s, 4s, … capped at 5 minutes.
const (
	wakeBackoffBase = 2 * time.Second
	wakeBackoffMax  = 5 * time.Minute
)

// NewWakeGuard is a guard with no backoff and no rate (Configure sets them).
func NewWakeGuard() *WakeGuard {
	return &WakeGuard{backoff: map[string]*wakeBackoff{}, admitted: map[string]time.Time{}}
}

// Configure applies a config's settings; backoff state is kept across
// reloads.
func (g *WakeGuard) Configure(userAgents []string, perSecond float64, burst int) {
	uas := make([]string, len(userAgents))
	for i, ua := range userAgents {
		uas[i] = strings.ToLower(ua)
	}
	var lim *rate.Limiter
	if perSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(perSecond), max(burst, 1))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.userAgents, g.limiter = uas, lim
}

// Crawler reports whether a User-Agent must not wake sandboxes.
func (g *WakeGuard) Crawler(ua string) bool {
	g.mu.Lock()
	uas := g.userAgents
	g.mu.Unlock()
	if ua == "" || len(uas) == 0 {
		return false
	}
	ua = strings.ToLower(ua)
	for _, s := range uas {
		if strings.Contains(ua, s) {
			return true
		}
	}
	return false
}

// BackingOff reports whether sandbox id's wakes are paused after failures,
// and for how long still.
func (g *WakeGuard) BackingOff(id string, now time.Time) (bool, time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.backoff[id]
	if b == nil || !now.Before(b.until) {
		return false, 0
	}
	return true, b.until.Sub(now)
}

// failed notes a failed wake of id.
func (g *WakeGuard) failed(id string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.backoff[id]
	if b == nil {
		b = &wakeBackoff{}
		g.backoff[id] = b
	}
	delete(g.admitted, id)
	b.failures++
	d := wakeBackoffBase << min(b.failures-1, 16)
	b.until = now.Add(min(d, wakeBackoffMax))
}

// Failures is how many wakes of id failed in a row (what its backoff
// counts); 0 after a success.
func (g *WakeGuard) Failures(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := g.backoff[id]; b != nil {
		return b.failures
	}
	return 0
}

// Reset clears id's backoff (a success, or an explicit API wake).
func (g *WakeGuard) Reset(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.backoff, id)
	delete(g.admitted, id)
}

// Answers of wakeGuard.allowWake.
const (
	wakeAllowed       = iota
	WakeRefusedClient // the client's own wake budget is spent
	WakeRefusedGlobal // wakes come faster than wake_rate
)

// AllowWake takes a wake of id from client's budget (clients) and from the
// global wake rate, answering wakeAllowed or which budget is spent.
// Requests for a wake already let through take nothing.
func (g *WakeGuard) AllowWake(id string, clients *ClientLimits, client netip.Prefix, now time.Time) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t, ok := g.admitted[id]; ok && now.Sub(t) < admittedFor {
		return wakeAllowed
	}
	ok, giveBack := clients.reserveWake(client, now)
	if !ok {
		return WakeRefusedClient
	}
	if g.limiter != nil && !g.limiter.AllowN(now, 1) {
		giveBack()
		return WakeRefusedGlobal
	}
	if len(g.admitted) > 10000 { // bounded: forget old entries
		for k, t := range g.admitted {
			if now.Sub(t) >= admittedFor {
				delete(g.admitted, k)
			}
		}
	}
	g.admitted[id] = now
	return wakeAllowed
}
