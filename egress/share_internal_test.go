package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// replyWriter is a dns.ResponseWriter of one query from addr, keeping the
// reply's rcode.
type replyWriter struct {
	from  netip.Addr
	rcode atomic.Int32 // -1 until the reply
	addrs atomic.Int32 // A records in the reply
}

func newReplyWriter(from netip.Addr) *replyWriter {
	w := &replyWriter{from: from}
	w.rcode.Store(-1)
	return w
}

func (w *replyWriter) LocalAddr() net.Addr { return &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 53} }
func (w *replyWriter) RemoteAddr() net.Addr {
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(w.from, 40000))
}
func (w *replyWriter) WriteMsg(m *dns.Msg) error {
	n := 0
	for _, rr := range m.Answer {
		if _, ok := rr.(*dns.A); ok {
			n++
		}
	}
	w.addrs.Store(int32(n))
	w.rcode.Store(int32(m.Rcode))
	return nil
}
func (w *replyWriter) Write([]byte) (int, error) { return 0, errors.New("not used") }
func (w *replyWriter) Close() error              { return nil }
func (w *replyWriter) TsigStatus() error         { return nil }
func (w *replyWriter) TsigTimersOnly(bool)       {}
func (w *replyWriter) Hijack()                   {}

// TestASandboxKeepsItsShareOfTheForwarder reproduces security review's
// third DNS finding: sandboxes holding queries to a stalled upstream (more
// than enough together to fill the forwarder's shared slots, each at its
// own bound) leave a new sandbox's lookups answered. The upstream is a
// stand-in exchange that holds the stalled names until the test lets go
// (no timers); the forwarder's admission is the code under test.
func TestASandboxKeepsItsShareOfTheForwarder(t *testing.T) {
	f := New(Options{})
	release := make(chan struct{})
	var stalled atomic.Int64
	fw := &forwarder{f: f, exchange: func(_ []netip.Addr, q dns.Question) (*dns.Msg, error) {
		if strings.HasPrefix(q.Name, "stalled-") {
			stalled.Add(1)
			<-release
			return nil, errors.New("the upstream never answered")
		}
		m := new(dns.Msg)
		m.SetQuestion(q.Name, q.Qtype)
		m.Response = true
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(198, 51, 100, 1)}}
		return m, nil
	}}
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	sandbox := func(i int) netip.Addr {
		addr := netip.AddrFrom4([4]byte{172, 31, byte(i / 250), byte(2 + i%250)})
		id := fmt.Sprintf("sb%d", i)
		sb := newSandbox(id)
		sb.setRules(lifecycle.FirewallEntry{ID: id, Address: addr, Egress: lifecycle.Egress{Policy: lifecycle.EgressPublic}})
		f.smu.Lock()
		f.byID[id], f.byAddr[addr] = sb, sb
		f.smu.Unlock()
		return addr
	}
	ask := func(from netip.Addr, name string) *replyWriter {
		w := newReplyWriter(from)
		req := new(dns.Msg)
		req.SetQuestion(dns.Fqdn(name), dns.TypeA)
		fw.serve(w, req)
		return w
	}

	// Enough sandboxes to fill the shared slots, each past its own bound.
	holders := maxInflight/maxInflightPerSandbox + 4
	perHolder := maxInflightPerSandbox + 1
	var wg sync.WaitGroup
	var refused atomic.Int64
	var held []netip.Addr
	for i := range holders {
		from := sandbox(i)
		held = append(held, from)
		for j := range perHolder {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if w := ask(from, fmt.Sprintf("stalled-%d-%d.test", i, j)); w.rcode.Load() == dns.RcodeServerFailure {
					refused.Add(1)
				}
			}()
		}
	}
	total := int64(holders * perHolder)
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		s, r := stalled.Load(), refused.Load()
		return s+r >= total, fmt.Sprintf("%d queries held at the upstream and %d refused, of %d", s, r, total)
	})
	if n := fw.inflight.Load(); n != maxInflight {
		t.Fatalf("%d shared slots taken, want all %d: the test did not fill the forwarder", n, maxInflight)
	}
	if r := refused.Load(); r < int64(holders) {
		t.Fatalf("%d queries refused, want at least one per holding sandbox (%d)", r, holders)
	}

	// Two new sandboxes: every lookup answered, a few at once.
	for i := range 2 {
		from := sandbox(holders + i)
		var answers sync.WaitGroup
		ws := make([]*replyWriter, reservedPerSandbox)
		for j := range ws {
			answers.Add(1)
			go func() {
				defer answers.Done()
				ws[j] = ask(from, fmt.Sprintf("app-%d.example.test", j))
			}()
		}
		answers.Wait()
		for j, w := range ws {
			if rc, n := w.rcode.Load(), w.addrs.Load(); rc != dns.RcodeSuccess || n != 1 {
				t.Errorf("sandbox %s, lookup %d while the forwarder is full: rcode %s with %d addresses, want an answer", from, j, dns.RcodeToString[int(rc)], n)
			}
		}
	}
	// A holding sandbox is still held to its bounds: refused at once.
	if w := ask(held[0], "more.example.test"); w.rcode.Load() != dns.RcodeServerFailure {
		t.Errorf("a sandbox at its bound was answered %s, want SERVFAIL", dns.RcodeToString[int(w.rcode.Load())])
	}

	letGo()
	wg.Wait()
	if n := fw.inflight.Load(); n != 0 {
		t.Errorf("%d shared slots still taken after every query ended", n)
	}
	f.smu.RLock()
	defer f.smu.RUnlock()
	for id, sb := range f.byID {
		if n := sb.inflight.Load(); n != 0 {
			t.Errorf("sandbox %s counts %d queries in flight after every query ended", id, n)
		}
	}
}
