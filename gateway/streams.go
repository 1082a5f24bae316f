package gateway

import (
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Defaults of the event stream caps. A stream costs a connection, a
// goroutine and a subscription buffer (about 50 KiB all told), and anyone
// may open one on any preview host. A warming page holds one only while its
// sandbox wakes and falls back to polling the status when refused, so the
// caps can be tight: 1000 streams is about 50 MiB; 16 per client covers a
// person (or an office behind one NAT address) with many previews waking at
// once.
const (
	DefaultMaxEventStreams          = 1000
	DefaultMaxEventStreamsPerClient = 16
)

// StreamRetryAfter is the Retry-After, in seconds, of a refused stream.
const StreamRetryAfter = 5

// StreamLimiter caps the event streams open on preview hosts, overall and
// per client address.
type StreamLimiter struct {
	mu        sync.Mutex
	max       int // 0: no cap
	perClient int // 0: no cap
	total     int
	byClient  map[netip.Prefix]int
}

// NewStreamLimiter is a limiter with no caps (Configure sets them).
func NewStreamLimiter() *StreamLimiter {
	return &StreamLimiter{byClient: make(map[netip.Prefix]int)}
}

// Configure sets the caps; streams already open stay open.
func (l *StreamLimiter) Configure(max, perClient int) {
	l.mu.Lock()
	l.max, l.perClient = max, perClient
	l.mu.Unlock()
}

// Acquire admits one stream of client, or refuses it with the status to
// answer: 429 when the client has its share open, 503 when the host has.
// An admitted stream must be released exactly once.
func (l *StreamLimiter) Acquire(client netip.Prefix) (release func(), status int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perClient > 0 && l.byClient[client] >= l.perClient {
		return nil, http.StatusTooManyRequests
	}
	if l.max > 0 && l.total >= l.max {
		return nil, http.StatusServiceUnavailable
	}
	l.total++
	l.byClient[client]++
	var once sync.Once
	return func() { once.Do(func() { l.release(client) }) }, 0
}

func (l *StreamLimiter) release(client netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byClient[client]--; l.byClient[client] <= 0 {
		delete(l.byClient, client)
	}
}

// Open reports how many streams are open, overall and of client.
func (l *StreamLimiter) Open(client netip.Prefix) (total, ofClient int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.byClient[client]
}

// StreamClient is the address a stream is counted against: Caddy's client
// IP (the remote address, or the forwarded one when the server trusts the
// proxy that sent it), an IPv6 address widened to its /64, which one host
// usually holds whole.
func StreamClient(r *http.Request) netip.Prefix {
	ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if ip == "" {
		ip, _, _ = net.SplitHostPort(r.RemoteAddr)
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Prefix{} // one bucket for whatever cannot be parsed
	}
	addr = addr.Unmap().WithZone("")
	bits := addr.BitLen()
	if addr.Is6() {
		bits = 64
	}
	p, _ := addr.Prefix(bits)
	return p
}
