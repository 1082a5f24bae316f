package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/egress/dnswire"
	"github.com/sandwake/sandwake/lifecycle"
)

// This file is the DNS forwarder sandboxes resolve through: a server on
// the sandbox network's gateway address, port 53, which Docker's embedded
// resolver asks from each container's own address (the container's DNS
// option, lifecycle/docker). It knows who asks by that address (bound to
// the container's port, bindings.go, so it cannot be forged), asks the
// operator's resolvers, and for an answer to a name the sandbox may reach
// puts the answer's addresses into the sandbox's sets before it answers,
// so that the first connect never races the rule (Cilium's toFQDNs).

// Bounds of the forwarder's work.
const (
	// maxInflightPerSandbox and maxInflight bound the queries being
	// forwarded, for one sandbox and in all: past them the answer is
	// SERVFAIL at once.
	maxInflightPerSandbox = 64
	maxInflight           = 1024
	portDoT               = 853 // DNS over TLS
)

// forwarder is the running DNS server.
type forwarder struct {
	f        *Firewall
	udp, tcp *dns.Server
	inflight atomic.Int32
}

// startForwarder starts the forwarder on addr:53 (UDP and TCP); it returns
// once both listen.
func (f *Firewall) startForwarder(addr netip.Addr) (*forwarder, error) {
	fw := &forwarder{f: f}
	ap := netip.AddrPortFrom(addr, dnswire.Port).String()
	pc, err := net.ListenPacket("udp4", ap)
	if errors.Is(err, syscall.EACCES) {
		return nil, fmt.Errorf("%w: the DNS forwarder sandboxes resolve through cannot listen on %s: %v; the gateway needs CAP_NET_BIND_SERVICE "+
			"(root has it; under systemd AmbientCapabilities=CAP_NET_ADMIN CAP_NET_BIND_SERVICE; the image's binary holds it as a file capability), "+
			"or write `egress unenforced` in the sandwake block to run sandboxes without egress policy", lifecycle.ErrEgressUnenforced, ap, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: the DNS forwarder sandboxes resolve through cannot listen on %s (udp): %v; "+
			"another DNS server listening on port 53 of every address (dnsmasq, a resolver bound to 0.0.0.0) must be bound to its own addresses instead",
			lifecycle.ErrEgressUnenforced, ap, err)
	}
	ln, err := net.Listen("tcp4", ap)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("%w: the DNS forwarder cannot listen on %s (tcp): %v", lifecycle.ErrEgressUnenforced, ap, err)
	}
	h := dns.HandlerFunc(fw.serve)
	fw.udp = &dns.Server{PacketConn: pc, Handler: h, MsgAcceptFunc: dnswire.AcceptQuery, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	fw.tcp = &dns.Server{Listener: ln, Handler: h, MsgAcceptFunc: dnswire.AcceptQuery, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		IdleTimeout: func() time.Duration { return 8 * time.Second }, MaxTCPQueries: 128}
	for _, s := range []*dns.Server{fw.udp, fw.tcp} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go func() {
			if err := s.ActivateAndServe(); err != nil {
				f.log.Warn("dns forwarder stopped", zap.Error(err))
			}
		}()
		<-started
	}
	return fw, nil
}

// stop shuts the forwarder down, waiting at most a few seconds.
func (fw *forwarder) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, s := range []*dns.Server{fw.udp, fw.tcp} {
		if err := s.ShutdownContext(ctx); err != nil {
			// Not started or timed out: close the sockets anyway.
			if s.PacketConn != nil {
				s.PacketConn.Close()
			}
			if s.Listener != nil {
				s.Listener.Close()
			}
		}
	}
}

// serve answers one query.
func (fw *forwarder) serve(w dns.ResponseWriter, req *dns.Msg) {
	src := dnswire.SourceAddr(w.RemoteAddr())
	f := fw.f
	f.smu.RLock()
	sb := f.byAddr[src]
	f.smu.RUnlock()
	if sb == nil || len(req.Question) != 1 {
		dnswire.Reply(w, req, dns.RcodeRefused)
		return
	}
	q := req.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	if q.Qclass != dns.ClassINET || q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR || q.Qtype == dns.TypeANY ||
		strings.ContainsAny(name, "\\ ") {
		dnswire.Reply(w, req, dns.RcodeRefused)
		return
	}
	now := time.Now()
	sb.lastLookup.Store(now.UnixNano())
	policy, allowed, denied := sb.judge(name)
	if policy == lifecycle.EgressNone && !allowed {
		// Under none a name the sandbox may not reach is not asked
		// anywhere: no query leaves the host (no tunnelling through the
		// operator's resolvers), and the app's error names the name.
		sb.log.lookup(name, nil, false, now)
		dnswire.Reply(w, req, dns.RcodeNameError)
		return
	}
	if n := fw.inflight.Add(1); n > maxInflight {
		fw.inflight.Add(-1)
		dnswire.Reply(w, req, dns.RcodeServerFailure)
		return
	}
	defer fw.inflight.Add(-1)
	if n := sb.inflight.Add(1); n > maxInflightPerSandbox {
		sb.inflight.Add(-1)
		dnswire.Reply(w, req, dns.RcodeServerFailure)
		return
	}
	defer sb.inflight.Add(-1)
	resp, err := dnswire.Exchange(f.upstreams(), q)
	if err != nil {
		f.log.Debug("dns forwarder: upstream", zap.String("name", name), zap.Error(err))
		dnswire.Reply(w, req, dns.RcodeServerFailure)
		return
	}
	addrs, ttl := dnswire.AnswerAddrs(resp, q.Name)
	if len(addrs) > 0 {
		if err := f.answered(sb, name, addrs, ttl, now); err != nil {
			// The first connect would be refused: better no answer.
			f.log.Warn("dns forwarder: opening an answer", zap.String("id", sb.id), zap.String("name", name), zap.Error(err))
			dnswire.Reply(w, req, dns.RcodeServerFailure)
			return
		}
	}
	if q.Qtype == dns.TypeA || q.Qtype == dns.TypeCNAME || len(addrs) > 0 {
		sb.log.lookup(name, addrs, !denied && (allowed || policy != lifecycle.EgressNone), now)
	}
	if denied {
		// Its addresses are refused for the answer's TTL (filled above);
		// the app learns the name is refused here.
		dnswire.Reply(w, req, dns.RcodeNameError)
		return
	}
	dnswire.Forward(w, req, resp)
}

// answered keeps the answer a sandbox got for name and writes what it
// opens (or refuses) into the sandbox's sets, before the answer goes out.
func (f *Firewall) answered(sb *sandbox, name string, addrs []netip.Addr, ttl uint32, now time.Time) error {
	minTTL, maxTTL := f.ttlBounds()
	keep := min(max(time.Duration(ttl)*time.Second, minTTL), maxTTL)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.remember(name, addrs, now.Add(keep), now)
	sets := map[string][]element{}
	sb.fill(sets, name, addrs, keep, f.opensPrivate)
	if len(sets) == 0 {
		return nil
	}
	t := f.tableRef.Load()
	if t == nil {
		return errors.New("the firewall is not set up")
	}
	c, err := newConn()
	if err != nil {
		return err
	}
	for set, els := range sets {
		s := &nftables.Set{Table: t, Name: set, KeyType: nftables.TypeIPAddr, HasTimeout: true}
		var renew []element
		for i := range els {
			key := set + "|" + els[i].addr.String()
			w, had := sb.written[key]
			// The kernel renews an element's expiry when it is added
			// again with another timeout, not the same one: never the
			// round figure a packet's refresh writes (maxTTL), and not
			// the figure written last.
			els[i].timeout -= time.Millisecond
			if had && w.timeout == els[i].timeout {
				els[i].timeout -= 2 * time.Millisecond
			}
			if had && !f.timeoutUpdates && w.expires.After(now) {
				renew = append(renew, els[i])
			}
			sb.written[key] = written{timeout: els[i].timeout, expires: now.Add(els[i].timeout)}
		}
		if err := c.SetAddElements(s, setElements(els)); err != nil {
			return err
		}
		if len(renew) > 0 {
			// A kernel that keeps the first timeout of an element added
			// again: deleted and added anew in the same batch (slower).
			if err := c.SetDeleteElements(s, setElements(renew)); err != nil {
				return err
			}
			if err := c.SetAddElements(s, setElements(renew)); err != nil {
				return err
			}
		}
	}
	return c.Flush()
}

// setElements are els as set elements.
func setElements(els []element) []nftables.SetElement {
	out := make([]nftables.SetElement, len(els))
	for i, e := range els {
		k := e.addr.As4()
		out[i] = nftables.SetElement{Key: k[:], Timeout: e.timeout}
	}
	return out
}
