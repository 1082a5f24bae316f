package egress

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/sandwake/sandwake/egress/dnswire"
	"github.com/sandwake/sandwake/lifecycle"
)

// This file is the DNS forwarder sandboxes resolve through: a server on
// the sandbox network's gateway address, port 53, which Docker's embedded
// resolver asks from each container's own address (the container's DNS
// option, lifecycle/docker). It knows who asks by that address, which
// is true only on the sandbox bridge (bound to the container's port there,
// bindings.go): it hears only what arrived on the bridge, so a datagram
// with a sandbox's source address routed in on another interface (eth0, a
// VPN) is not taken for the sandbox. It asks the operator's resolvers, and
// for an answer to a name the sandbox may reach puts the answer's
// addresses into the sandbox's sets before it answers, so that the first
// connect never races the rule (Cilium's toFQDNs).

// Bounds of the forwarder's work.
const (
	// maxInflightPerSandbox bounds one sandbox's queries being forwarded.
	// The first reservedPerSandbox of them are its own; each one past
	// those takes a slot of the maxInflight shared by all. Past either
	// bound the answer is SERVFAIL at once, so no sandbox, nor many
	// together holding queries to a stalled upstream, fails another's
	// lookups: a sandbox with fewer than reservedPerSandbox in flight
	// always gets its query asked. At most maxInflight plus
	// reservedPerSandbox per sandbox are in flight.
	maxInflightPerSandbox = 64
	reservedPerSandbox    = 8
	maxInflight           = 1024
	portDNS               = dnswire.Port
	portDoT               = 853 // DNS over TLS
)

// forwarder is the running DNS server.
type forwarder struct {
	f        *Firewall
	udp, tcp *dns.Server
	// inflight counts the shared slots taken (queries past their
	// sandbox's reserved few).
	inflight atomic.Int32
	// exchange asks the upstream resolvers (dnswire.Exchange).
	exchange func([]netip.Addr, dns.Question) (*dns.Msg, error)
	// bridge is the sandbox bridge's interface index, which every query
	// must have arrived on; looked is when it was last looked up (unix
	// nanoseconds). foreign counts the datagrams dropped for arriving
	// elsewhere.
	bridge  atomic.Int32
	looked  atomic.Int64
	foreign atomic.Uint64
	// ap is the address both listen on (gateway:53).
	ap string
	// tcpMu guards tcp, tcpUnbound and stopped: the TCP listener is
	// opened anew when the bridge's index changes (reopenTCP).
	tcpMu sync.Mutex
	// tcpUnbound is set when the kernel refused to bind the TCP listener
	// to the bridge: it listens on every interface (bindTCPToBridge).
	tcpUnbound bool
	stopped    bool
}

// bindStep names the step that binds the TCP listener to the bridge, in
// logs and errors.
const bindStep = "binding the dns forwarder's tcp listener to the sandbox bridge (SO_BINDTOIFINDEX)"

// startForwarder starts the forwarder on addr:53 (UDP and TCP); it returns
// once both listen.
func (f *Firewall) startForwarder(addr netip.Addr) (*forwarder, error) {
	fw := &forwarder{f: f, exchange: dnswire.Exchange}
	br := f.bridgeIndex()
	if br == 0 {
		return nil, fmt.Errorf("%w: the DNS forwarder cannot find the sandbox bridge %q", lifecycle.ErrEgressUnenforced, f.bridgeName())
	}
	fw.bridge.Store(br)
	fw.looked.Store(time.Now().UnixNano())
	ap := netip.AddrPortFrom(addr, dnswire.Port).String()
	fw.ap = ap
	// UDP: each datagram's arrival interface (IP_PKTINFO) is checked
	// against the bridge's current index (bridgeConn). TCP: the listener
	// is bound to the bridge (SO_BINDTOIFINDEX), so the kernel matches no
	// connection arriving elsewhere to it. Both hold without the input
	// chain's rule for port 53 (a table installed by an older release has
	// none).
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		})
		if serr != nil {
			serr = fmt.Errorf("asking for each datagram's arrival interface (IP_PKTINFO): %w", serr)
		}
		return cmp.Or(err, serr)
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", ap)
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
	fw.udp = &dns.Server{PacketConn: &bridgeConn{UDPConn: pc.(*net.UDPConn), fw: fw, oob: make([]byte, 128)}, Handler: dns.HandlerFunc(fw.serve),
		MsgAcceptFunc: dnswire.AcceptQuery, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	if err := fw.listenTCP(br); err != nil {
		pc.Close()
		return nil, fmt.Errorf("%w: the DNS forwarder cannot listen on %s (tcp): %v", lifecycle.ErrEgressUnenforced, ap, err)
	}
	fw.activate(fw.udp)
	fw.activate(fw.tcp)
	return fw, nil
}

// listenTCP opens the TCP listener on fw.ap, bound to bridge index br,
// into fw.tcp (not yet serving); the caller holds fw.tcpMu or is
// startForwarder.
func (fw *forwarder) listenTCP(br int32) error {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = fw.bindTCPToBridge(fd, br) })
		return cmp.Or(err, serr)
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", fw.ap)
	if err != nil {
		return err
	}
	fw.tcp = &dns.Server{Listener: ln, Handler: dns.HandlerFunc(fw.serve), MsgAcceptFunc: dnswire.AcceptQuery, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		IdleTimeout: func() time.Duration { return 8 * time.Second }, MaxTCPQueries: 128}
	return nil
}

// bindTCPToBridge binds the fresh socket fd to bridge index br, before it
// is bound to its address. A kernel before 5.0 has no SO_BINDTOIFINDEX
// (ENOPROTOOPT), and one before 5.7 asks CAP_NET_RAW for it (EPERM):
// then the listener stays unbound, with a warning, and the firewall's
// input rule for port 53 still drops what arrives elsewhere.
func (fw *forwarder) bindTCPToBridge(fd uintptr, br int32) error {
	err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BINDTOIFINDEX, int(br))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOPROTOOPT):
		fw.tcpUnbound = true
		fw.f.log.Warn(bindStep+" was refused: it listens unbound, and only the firewall's input rule keeps port 53 arriving on other interfaces from it",
			zap.String("bridge", fw.f.bridgeName()), zap.Error(err))
		return nil
	default:
		return fmt.Errorf("%s: %w", bindStep, err)
	}
}

// activate starts serving s and returns once it serves.
func (fw *forwarder) activate(s *dns.Server) {
	started := make(chan struct{})
	s.NotifyStartedFunc = func() { close(started) }
	go func() {
		if err := s.ActivateAndServe(); err != nil {
			fw.f.log.Warn("dns forwarder stopped", zap.Error(err))
		}
	}()
	<-started
}

// reopenTCP closes the TCP listener and opens a fresh one bound to the
// bridge's new index br: binding a bound socket again needs CAP_NET_RAW,
// a fresh one does not (Linux 5.7+). Meanwhile a TCP query is refused
// (the client retries); the old bridge's connections are gone with it.
func (fw *forwarder) reopenTCP(br int32) {
	fw.tcpMu.Lock()
	defer fw.tcpMu.Unlock()
	if fw.stopped || fw.tcpUnbound {
		return // an unbound listener hears the new bridge already
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if fw.tcp != nil {
		shutdown(ctx, fw.tcp)
		fw.tcp = nil
	}
	if err := fw.listenTCP(br); err != nil {
		fw.tcp = nil
		fw.f.log.Warn("dns forwarder: reopening the tcp listener on the new sandbox bridge (queries over tcp are refused until the gateway starts again)", zap.Error(err))
		return
	}
	fw.activate(fw.tcp)
}

// stop shuts the forwarder down, waiting at most a few seconds.
func (fw *forwarder) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	fw.tcpMu.Lock()
	fw.stopped = true
	tcp := fw.tcp
	fw.tcpMu.Unlock()
	shutdown(ctx, fw.udp)
	if tcp != nil {
		shutdown(ctx, tcp)
	}
}

// shutdown stops s, closing its sockets should it not stop within ctx.
func shutdown(ctx context.Context, s *dns.Server) {
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
	n := sb.inflight.Add(1)
	defer sb.inflight.Add(-1)
	if n > maxInflightPerSandbox {
		dnswire.Reply(w, req, dns.RcodeServerFailure)
		return
	}
	if n > reservedPerSandbox {
		// Past its reserved few: a slot of the shared pool, released by
		// this query whatever its sandbox's count is by then.
		defer fw.inflight.Add(-1)
		if fw.inflight.Add(1) > maxInflight {
			dnswire.Reply(w, req, dns.RcodeServerFailure)
			return
		}
	}
	resp, err := fw.exchange(f.upstreams(), q)
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

// bridgeConn is the forwarder's UDP socket, reading only the datagrams
// that arrived on the sandbox bridge: a source address is a sandbox's
// only there. One goroutine reads (the server's loop), so oob is its.
type bridgeConn struct {
	*net.UDPConn
	fw  *forwarder
	oob []byte
}

// ReadFrom implements net.PacketConn: the next datagram that arrived on
// the bridge; others are dropped unanswered and counted.
func (c *bridgeConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, oobn, _, from, err := c.ReadMsgUDP(b, c.oob)
		if err != nil {
			return n, nil, err
		}
		if c.fw.fromBridge(arrival(c.oob[:oobn])) {
			return n, from, nil
		}
		c.fw.foreign.Add(1)
	}
}

// arrival is the interface index IP_PKTINFO gives in oob (0: none). It
// runs per datagram, so it parses in place (ParseSocketControlMessage
// allocates a slice).
func arrival(oob []byte) int32 {
	// ParseOneSocketControlMessage reads a header without checking that
	// one fits.
	for len(oob) >= unix.SizeofCmsghdr {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return 0
		}
		if h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo {
			return int32(binary.NativeEndian.Uint32(data))
		}
		oob = rest
	}
	return 0
}

// fromBridge reports whether interface index idx is the sandbox bridge's.
// Another index looks the bridge up again, at most once a second: a
// bridge made again (or a new network with the same gateway) gets a new
// index, and the forwarder follows it; a flood from elsewhere costs one
// lookup a second.
func (fw *forwarder) fromBridge(idx int32) bool {
	if idx > 0 && idx == fw.bridge.Load() {
		return true
	}
	now, last := time.Now().UnixNano(), fw.looked.Load()
	if now-last < int64(time.Second) || !fw.looked.CompareAndSwap(last, now) {
		return false
	}
	br := fw.f.bridgeIndex()
	if br == 0 {
		return false
	}
	if fw.bridge.Swap(br) != br {
		// The TCP listener follows: a fresh socket, bound to the new
		// index (rare: the network was made again).
		fw.reopenTCP(br)
	}
	return idx == br
}

// bridgeName is the bridge the table guards, read without f.mu (Setup
// stores the table before it starts the forwarder).
func (f *Firewall) bridgeName() string {
	if t := f.tableRef.Load(); t != nil {
		return strings.TrimPrefix(t.Name, TableName(""))
	}
	return ""
}

// bridgeIndex is the bridge's interface index (0 when there is none).
func (f *Firewall) bridgeIndex() int32 {
	ifc, err := net.InterfaceByName(f.bridgeName())
	if err != nil {
		return 0
	}
	return int32(ifc.Index)
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

// Interface guard: the server reads the bridge-only socket as a generic
// net.PacketConn.
var _ net.PacketConn = (*bridgeConn)(nil)
