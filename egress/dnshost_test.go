package egress_test

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// record is one name of the test's DNS server: an address, or a CNAME
// target, with its TTL.
type record struct {
	addr   netip.Addr
	target string
	ttl    uint32
}

// dnsHost is the upstream resolver of the test's own (egress_dns): a DNS
// server inside the test hosts' namespace, on the namespace's end of the
// veth pair, answering its zone and counting the queries per name.
type dnsHost struct {
	mu   sync.Mutex
	zone map[string]record
	asks map[string]int
	// dynamic answers names outside the zone, when set.
	dynamic func(name string) (record, bool)
}

// serveDNS starts the server in h's namespace on h.private:53.
func (h *testHosts) serveDNS(t testing.TB, zone map[string]record) *dnsHost {
	t.Helper()
	return h.serveDNSAt(t, h.private, zone)
}

// serveDNSAt starts the server in h's namespace on at:53 (one of its
// addresses).
func (h *testHosts) serveDNSAt(t testing.TB, at netip.Addr, zone map[string]record) *dnsHost {
	t.Helper()
	d := &dnsHost{zone: map[string]record{}, asks: map[string]int{}}
	for n, r := range zone {
		d.zone[dns.Fqdn(n)] = r
	}
	var servers []*dns.Server
	err := h.inNS(func() error {
		pc, err := net.ListenPacket("udp", netip.AddrPortFrom(at, 53).String())
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", netip.AddrPortFrom(at, 53).String())
		if err != nil {
			pc.Close()
			return err
		}
		servers = []*dns.Server{{PacketConn: pc, Handler: d}, {Listener: ln, Handler: d}}
		return nil
	})
	if err != nil {
		t.Fatalf("dns server in %s: %v", h.ns, err)
	}
	for _, s := range servers {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
		}
	})
	return d
}

// ServeDNS answers from the zone: A records (CNAME chains followed within
// the zone), NXDOMAIN for names outside it.
func (d *dnsHost) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	d.mu.Lock()
	d.asks[name]++
	zone, dynamic := d.zone, d.dynamic
	d.mu.Unlock()
	r, ok := zone[name]
	if !ok && dynamic != nil {
		r, ok = dynamic(name)
	}
	if !ok {
		m.Rcode = dns.RcodeNameError
		w.WriteMsg(m)
		return
	}
	for range 8 {
		if r.target == "" {
			break
		}
		m.Answer = append(m.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: r.ttl}, Target: dns.Fqdn(r.target)})
		name = dns.Fqdn(r.target)
		if r, ok = zone[name]; !ok {
			break
		}
	}
	if ok && r.addr.IsValid() && q.Qtype == dns.TypeA {
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: r.ttl}, A: r.addr.AsSlice()})
	}
	w.WriteMsg(m)
}

// asked is how many queries for name came.
func (d *dnsHost) asked(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asks[dns.Fqdn(strings.ToLower(name))]
}
