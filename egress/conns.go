package egress

import (
	"net/netip"
	"sync"
	"time"

	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
)

// connTable reads the kernel's connection table for the sandboxes that
// hold an established outbound connection (Outbound): one dump serves
// every question for connsEvery.
type connTable struct {
	mu      sync.Mutex
	at      time.Time
	subnet  netip.Prefix
	gateway netip.Addr
	holders map[netip.Addr]bool
}

const connsEvery = time.Second

// TCP_CONNTRACK_ESTABLISHED.
const tcpEstablished = 3

func (t *connTable) setNet(subnet netip.Prefix, gateway netip.Addr) {
	t.mu.Lock()
	t.subnet, t.gateway, t.at = subnet, gateway, time.Time{}
	t.mu.Unlock()
}

// open reports whether addr holds an established connection it opened to
// a destination off the sandbox network.
func (t *connTable) open(addr netip.Addr, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Sub(t.at) >= connsEvery || now.Before(t.at) {
		t.holders = t.dump()
		t.at = now
	}
	return t.holders[addr]
}

// dump lists the holders; on an error none (outbound work then does not
// count, which errs on the side of sleeping).
func (t *connTable) dump() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	if !t.subnet.IsValid() {
		return out
	}
	c, err := conntrack.Dial(nil)
	if err != nil {
		return out
	}
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		return out
	}
	for i := range flows {
		fl := &flows[i]
		src, dst := fl.TupleOrig.IP.SourceAddress, fl.TupleOrig.IP.DestinationAddress
		if !t.subnet.Contains(src) || t.subnet.Contains(dst) || dst == t.gateway {
			continue
		}
		switch fl.TupleOrig.Proto.Protocol {
		case unix.IPPROTO_TCP:
			if fl.ProtoInfo.TCP != nil && fl.ProtoInfo.TCP.State == tcpEstablished {
				out[src] = true
			}
		case unix.IPPROTO_UDP:
			if fl.Status.Assured() {
				out[src] = true
			}
		}
	}
	return out
}
