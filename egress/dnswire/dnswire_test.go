package dnswire

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/miekg/dns"
)

func rr(t *testing.T, s string) dns.RR {
	t.Helper()
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestAnswerAddrs: the addresses of the asked name, through CNAME chains
// in the answer, with the least TTL on the way; records of other names
// give nothing (a resolver's answer cannot open a name nobody asked).
func TestAnswerAddrs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer []string
		rcode  int
		want   []string
		ttl    uint32
	}{
		{"an A record", []string{"a.test. 300 IN A 198.51.100.7"}, dns.RcodeSuccess, []string{"198.51.100.7"}, 300},
		{"a CNAME chain", []string{"a.test. 60 IN CNAME b.test.", "b.test. 30 IN CNAME c.test.", "c.test. 300 IN A 198.51.100.8"}, dns.RcodeSuccess, []string{"198.51.100.8"}, 30},
		{"the case of the names ignored", []string{"A.Test. 300 IN A 198.51.100.7"}, dns.RcodeSuccess, []string{"198.51.100.7"}, 300},
		{"another name's record", []string{"evil.test. 300 IN A 203.0.113.9", "a.test. 100 IN A 198.51.100.7"}, dns.RcodeSuccess, []string{"198.51.100.7"}, 100},
		{"duplicates once", []string{"a.test. 300 IN A 198.51.100.7", "a.test. 200 IN A 198.51.100.7"}, dns.RcodeSuccess, []string{"198.51.100.7"}, 300},
		{"AAAA left out", []string{"a.test. 300 IN AAAA 2001:db8::1"}, dns.RcodeSuccess, nil, 0},
		{"NXDOMAIN", []string{"a.test. 300 IN A 198.51.100.7"}, dns.RcodeNameError, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := new(dns.Msg)
			m.SetQuestion("a.test.", dns.TypeA)
			m.Rcode = tc.rcode
			for _, s := range tc.answer {
				m.Answer = append(m.Answer, rr(t, s))
			}
			addrs, ttl := AnswerAddrs(m, "a.test")
			var got []string
			for _, a := range addrs {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) || ttl != tc.ttl {
				t.Errorf("got %v ttl %d, want %v ttl %d", got, ttl, tc.want, tc.ttl)
			}
		})
	}
}

// TestAcceptQuery: a plain query with one question is taken; responses are
// ignored, other opcodes not implemented, and messages carrying answers or
// several questions refused.
func TestAcceptQuery(t *testing.T) {
	q := new(dns.Msg)
	q.SetQuestion("a.test.", dns.TypeA)
	header := func(m *dns.Msg) dns.Header {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		var h dns.Header
		h.Id = uint16(b[0])<<8 | uint16(b[1])
		h.Bits = uint16(b[2])<<8 | uint16(b[3])
		h.Qdcount = uint16(b[4])<<8 | uint16(b[5])
		h.Ancount = uint16(b[6])<<8 | uint16(b[7])
		h.Nscount = uint16(b[8])<<8 | uint16(b[9])
		h.Arcount = uint16(b[10])<<8 | uint16(b[11])
		return h
	}
	resp := q.Copy()
	resp.Response = true
	update := q.Copy()
	update.Opcode = dns.OpcodeUpdate
	two := q.Copy()
	two.Question = append(two.Question, dns.Question{Name: "b.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	stuffed := q.Copy()
	stuffed.Answer = []dns.RR{rr(t, "a.test. 300 IN A 198.51.100.7")}
	for _, tc := range []struct {
		name string
		m    *dns.Msg
		want dns.MsgAcceptAction
	}{
		{"a query", q, dns.MsgAccept},
		{"a response", resp, dns.MsgIgnore},
		{"an update", update, dns.MsgRejectNotImplemented},
		{"two questions", two, dns.MsgReject},
		{"an answer inside", stuffed, dns.MsgReject},
	} {
		if got := AcceptQuery(header(tc.m)); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSourceAddr(t *testing.T) {
	want := netip.MustParseAddr("172.28.0.2")
	for _, a := range []net.Addr{&net.UDPAddr{IP: net.ParseIP("172.28.0.2"), Port: 5353}, &net.TCPAddr{IP: net.ParseIP("172.28.0.2"), Port: 5353}} {
		if got := SourceAddr(a); got != want {
			t.Errorf("%v: %v, want %v", a, got, want)
		}
	}
	if got := SourceAddr(&net.UnixAddr{Name: "x"}); got.IsValid() {
		t.Errorf("a unix address: %v, want none", got)
	}
}
