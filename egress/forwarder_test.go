package egress_test

import (
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// dnsQuery is a packed query for name (type A).
func dnsQuery(t *testing.T, name string) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// portDNSDrops are the packets the input chain's rules for port 53 of the
// gateway counted, udp and tcp; found is false when it holds none.
func portDNSDrops(t *testing.T, bridge string) (udp, tcp int, handles []string, found bool) {
	t.Helper()
	out := nft(t, "-a", "list", "chain", "inet", egress.TableName(bridge), "input")
	re := regexp.MustCompile(`(udp|tcp) dport 53 counter packets (\d+) bytes \d+ drop # handle (\d+)`)
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[2])
		if m[1] == "udp" {
			udp = n
		} else {
			tcp = n
		}
		handles = append(handles, m[3])
	}
	return udp, tcp, handles, len(handles) > 0
}

// spoofer sends datagrams from the test hosts' namespace with a sandbox's
// source address to the gateway: the sandbox's address is put on the
// namespace's loopback and the gateway routed through the test's veth,
// as an outsider on eth0 or a VPN would reach it.
type spoofer struct {
	t       *testing.T
	h       *testHosts
	src     netip.Addr
	gateway netip.Addr
	mu      sync.Mutex
	conns   map[int]*net.UDPConn
}

func newSpoofer(t *testing.T, r *rig, src netip.Addr) *spoofer {
	t.Helper()
	h := r.hosts
	gw := r.net.Gateway
	// The gateway is this host's own address, and the namespace is ours.
	mustBeLocal(t, gw)
	for _, dev := range []string{"all", h.veth} {
		b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + dev + "/rp_filter")
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(b)) == "1" {
			t.Fatalf("rp_filter is strict on %s: a datagram with a sandbox's source address arriving on %s is dropped before any rule; the test needs it loose or off", dev, h.veth)
		}
	}
	run(t, "ip", "netns", "exec", h.ns, "ip", "addr", "add", src.String()+"/32", "dev", "lo")
	hostEnd := h.private.Prev()
	run(t, "ip", "netns", "exec", h.ns, "ip", "route", "add", gw.String()+"/32", "via", hostEnd.String(), "src", src.String())
	// The namespace and its routes go with it (newTestHosts' cleanup).
	out, err := exec.Command("ip", "netns", "exec", h.ns, "ip", "route", "get", gw.String(), "from", src.String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "via "+hostEnd.String()) {
		t.Fatalf("the gateway %s is not routed through the test's veth from %s: %s %v", gw, src, out, err)
	}
	s := &spoofer{t: t, h: h, src: src, gateway: gw, conns: map[int]*net.UDPConn{}}
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.conns {
			c.Close()
		}
	})
	return s
}

// send writes payload to the gateway's port from the sandbox's address.
func (s *spoofer) send(port int, payload []byte) {
	s.t.Helper()
	s.mu.Lock()
	c := s.conns[port]
	s.mu.Unlock()
	if c == nil {
		err := s.h.inNS(func() error {
			var err error
			c, err = net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.src, 0)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.gateway, uint16(port))))
			return err
		})
		if err != nil {
			s.t.Fatalf("a socket from %s in %s: %v", s.src, s.h.ns, err)
		}
		s.mu.Lock()
		s.conns[port] = c
		s.mu.Unlock()
	}
	if _, err := c.Write(payload); err != nil {
		s.t.Fatalf("sending from %s to %s:%d: %v", s.src, s.gateway, port, err)
	}
}

// looked reports whether the sandbox's log holds a lookup of name.
func looked(t *testing.T, r *rig, id, name string) bool {
	t.Helper()
	l, err := r.mgr.EgressLog(id)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(l.Lookups, func(x lifecycle.EgressLookup) bool { return x.Name == name })
}

// TestTheForwarderHearsOnlyItsBridge reproduces the security review's
// first DNS finding: a UDP query with a learn sandbox's source address,
// routed to the gateway through another interface (the test's veth), is
// not answered as that sandbox: no log line, no learned name, no query
// upstream, no slot taken. The input chain's rule drops it (its counter
// shows the datagram came); with the rule deleted, the forwarder's own
// check of the arrival interface drops it. The sandbox's own lookups are
// answered throughout. Then the second finding: the sandbox's own lookup
// of the literal "*.x.test" (which the upstream answers) is not learned,
// and the lock does not allow the subdomains.
func TestTheForwarderHearsOnlyItsBridge(t *testing.T) {
	var fw *egress.Firewall
	r := newNameRig(t, func(h *testHosts, c *lifecycle.Config) { fw = c.Firewall.(*egress.Firewall) })
	h := r.hosts
	rec := r.createCaps(testenv.UniqueID("hear"), lifecycle.Egress{Policy: lifecycle.EgressLearn}, "NET_RAW")
	if ok, body := r.lookup(rec, "learned-a.test"); !ok {
		t.Fatalf("the sandbox's own lookup: %s", body)
	}
	sp := newSpoofer(t, r.rig, rec.Address)
	// A listener of the test's own on the gateway address proves that a
	// datagram with the sandbox's address from the veth reaches the host.
	ctl, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(r.net.Gateway, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close() })
	ctlPort := ctl.LocalAddr().(*net.UDPAddr).Port
	var ctlMu sync.Mutex
	var ctlFrom []string
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := ctl.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			ctlMu.Lock()
			ctlFrom = append(ctlFrom, from.Addr().String()+" "+string(buf[:n]))
			ctlMu.Unlock()
		}
	}()
	sp.send(ctlPort, []byte("control"))
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		ctlMu.Lock()
		defer ctlMu.Unlock()
		return slices.Contains(ctlFrom, rec.Address.String()+" control"), "a datagram from the veth with the sandbox's address never reached the host"
	})

	unchanged := func(t *testing.T, name string) {
		t.Helper()
		if looked(t, r.rig, rec.ID, name) {
			t.Errorf("the outsider's lookup of %s is in the sandbox's log", name)
		}
		if n := r.dns.asked(name); n != 0 {
			t.Errorf("the upstream was asked %s %d times for the outsider", name, n)
		}
		if sb, shared := egress.Inflight(fw, rec.ID); sb != 0 || shared != 0 {
			t.Errorf("in flight after the outsider's query: %d of the sandbox, %d shared", sb, shared)
		}
		if err := r.mgr.FlushActivity(); err != nil {
			t.Fatal(err)
		}
		if kept, err := r.mgr.Get(rec.ID); err != nil || slices.Contains(kept.EgressLearned, name) {
			t.Errorf("the sandbox learned %v (%v), the outsider's %s among them", kept.EgressLearned, err, name)
		}
	}

	t.Run("the input chain drops port 53 from elsewhere", func(t *testing.T) {
		udp, _, _, found := portDNSDrops(t, r.net.Bridge)
		if !found {
			t.Fatalf("the input chain has no rule for port 53 of the gateway from elsewhere")
		}
		foreign := egress.ForeignQueries(fw)
		sp.send(53, dnsQuery(t, "unlisted.test"))
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			n, _, _, _ := portDNSDrops(t, r.net.Bridge)
			return n > udp || looked(t, r.rig, rec.ID, "unlisted.test"), "the outsider's query was neither dropped by the rule nor answered"
		})
		unchanged(t, "unlisted.test")
		if n := egress.ForeignQueries(fw); n != foreign {
			t.Errorf("the forwarder read %d datagrams from elsewhere past the rule", n-foreign)
		}
	})

	t.Run("the forwarder alone drops what arrived elsewhere", func(t *testing.T) {
		_, _, handles, _ := portDNSDrops(t, r.net.Bridge)
		for _, hd := range handles {
			nft(t, "delete", "rule", "inet", egress.TableName(r.net.Bridge), "input", "handle", hd)
		}
		if _, _, _, found := portDNSDrops(t, r.net.Bridge); found {
			t.Fatalf("the rules for port 53 are still there")
		}
		foreign := egress.ForeignQueries(fw)
		sp.send(53, dnsQuery(t, "other.test"))
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			return egress.ForeignQueries(fw) > foreign || looked(t, r.rig, rec.ID, "other.test") || r.dns.asked("other.test") > 0,
				"the outsider's query was neither dropped by the forwarder nor answered"
		})
		unchanged(t, "other.test")
		if ok, body := r.lookup(rec, "learned-b.test"); !ok {
			t.Errorf("the sandbox's own lookup after the outsider's: %s", body)
		}
		for _, proto := range []string{"udp", "tcp"} {
			if code, body := r.get(rec, "/lookup", url.Values{"name": {"learned-b.test"}, "server": {hp(r.net.Gateway, 53)}, "proto": {proto}}); code != 200 {
				t.Errorf("the sandbox's own lookup over %s: %d %s", proto, code, body)
			}
		}
	})

	t.Run("a name with a star label is not learned", func(t *testing.T) {
		r.dns.mu.Lock()
		r.dns.dynamic = func(name string) (record, bool) {
			switch name {
			case "*.x.test.", "y.x.test.":
				return record{addr: h.internet2, ttl: 1}, true
			}
			return record{}, false
		}
		r.dns.mu.Unlock()
		// Go's resolver refuses the name: the app sends the query itself,
		// from its own address, to the forwarder.
		r.ask(rec, "/raw", url.Values{"src": {rec.Address.String()}, "dst": {hp(r.net.Gateway, 53)}, "payload": {string(dnsQuery(t, "*.x.test"))}})
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			return looked(t, r.rig, rec.ID, "*.x.test"), "the sandbox's lookup of *.x.test never reached the forwarder"
		})
		if err := r.mgr.FlushActivity(); err != nil {
			t.Fatal(err)
		}
		kept, err := r.mgr.Get(rec.ID)
		if err != nil || slices.ContainsFunc(kept.EgressLearned, func(e string) bool { return strings.Contains(e, "*") }) {
			t.Fatalf("the record keeps %v (%v): a name with a star label", kept.EgressLearned, err)
		}
		locked, err := r.mgr.LockEgress(rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(locked.Spec.Egress.Allow, func(e string) bool { return strings.Contains(e, "*") }) {
			t.Errorf("the lock wrote %v: a wildcard from a lookup", locked.Spec.Egress.Allow)
		}
		if !slices.Contains(locked.Spec.Egress.Allow, "learned-a.test") {
			t.Errorf("the lock wrote %v, without the name the sandbox used", locked.Spec.Egress.Allow)
		}
		if ok, body := r.lookup(rec, "y.x.test"); ok {
			t.Errorf("after the lock a subdomain of *.x.test resolves: %s", body)
		}
	})
}
