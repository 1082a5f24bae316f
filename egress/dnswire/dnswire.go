package dnswire

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Port is DNS's port (UDP and TCP).
const Port = 53

// upstreamTimeout bounds one question to one upstream resolver.
const upstreamTimeout = 3 * time.Second

// AcceptQuery is a dns.MsgAcceptFunc for a forwarder: one question, a
// plain query, nothing answered in it; responses are ignored.
func AcceptQuery(h dns.Header) dns.MsgAcceptAction {
	if h.Bits&(1<<15) != 0 { // a response
		return dns.MsgIgnore
	}
	if opcode := int(h.Bits>>11) & 0xF; opcode != dns.OpcodeQuery {
		return dns.MsgRejectNotImplemented
	}
	if h.Qdcount != 1 || h.Ancount > 0 || h.Nscount > 0 || h.Arcount > 2 {
		return dns.MsgReject
	}
	return dns.MsgAccept
}

// Reply answers req with rcode and nothing else.
func Reply(w dns.ResponseWriter, req *dns.Msg, rcode int) {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	_ = w.WriteMsg(m)
}

// Forward writes resp as the answer to req: req's id and question, and,
// over UDP, cut to the size req allows. It changes resp, which is the
// caller's (Exchange's answer to this query), rather than copy it.
func Forward(w dns.ResponseWriter, req, resp *dns.Msg) {
	out := resp
	out.Id = req.Id
	out.Question = req.Question
	out.Response = true
	out.RecursionAvailable = true
	if w.LocalAddr().Network() == "udp" {
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			size = max(int(o.UDPSize()), dns.MinMsgSize)
		}
		out.Truncate(size)
	}
	_ = w.WriteMsg(out)
}

// Exchange asks the resolvers up, in turn, a fresh query for q (never the
// asker's message as it came), over TCP again when the answer was
// truncated.
func Exchange(up []netip.Addr, q dns.Question) (*dns.Msg, error) {
	if len(up) == 0 {
		return nil, errors.New("no upstream resolver (egress_dns, or nameservers in /etc/resolv.conf)")
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(strings.ToLower(q.Name)), q.Qtype)
	m.RecursionDesired = true
	m.SetEdns0(1232, false)
	var last error
	for _, a := range up {
		server := netip.AddrPortFrom(a, Port).String()
		c := &dns.Client{Net: "udp", Timeout: upstreamTimeout, UDPSize: 1232}
		resp, _, err := c.Exchange(m, server)
		if err == nil && resp.Truncated {
			c.Net = "tcp"
			resp, _, err = c.Exchange(m, server)
		}
		if err == nil {
			return resp, nil
		}
		last = err
	}
	return nil, last
}

// AnswerAddrs are the IPv4 addresses of resp's answer for qname, CNAME
// chains followed (in the answer section only), and the least TTL on the
// way.
func AnswerAddrs(resp *dns.Msg, qname string) ([]netip.Addr, uint32) {
	if resp.Rcode != dns.RcodeSuccess {
		return nil, 0
	}
	names := map[string]bool{strings.ToLower(dns.Fqdn(qname)): true}
	ttl := uint32(1<<32 - 1)
	// CNAMEs first, in as many rounds as the chain is long.
	for range 16 {
		grew := false
		for _, rr := range resp.Answer {
			if c, ok := rr.(*dns.CNAME); ok && names[strings.ToLower(c.Hdr.Name)] && !names[strings.ToLower(c.Target)] {
				names[strings.ToLower(c.Target)] = true
				ttl = min(ttl, c.Hdr.Ttl)
				grew = true
			}
		}
		if !grew {
			break
		}
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok && names[strings.ToLower(a.Hdr.Name)] {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok && !slices.Contains(out, ip) {
				out = append(out, ip)
				ttl = min(ttl, a.Hdr.Ttl)
			}
		}
	}
	if len(out) == 0 {
		return nil, 0
	}
	return out, ttl
}

// SourceAddr is the IPv4 address a query came from (UDP or TCP); the zero
// Addr for anything else.
func SourceAddr(a net.Addr) netip.Addr {
	switch v := a.(type) {
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(v.IP.To4())
		return ip
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(v.IP.To4())
		return ip
	}
	return netip.Addr{}
}
