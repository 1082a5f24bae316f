package lifecycle_test

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// denyingFirewall is a fakeFirewall that observes: the test calls the
// denied-destination function the manager gave it, as the kernel's log
// reader would.
type denyingFirewall struct {
	*fakeFirewall
	mu     sync.Mutex
	denied func(string, lifecycle.EgressDecision)
}

func (f *denyingFirewall) EgressLog(string) lifecycle.EgressLog { return lifecycle.EgressLog{} }
func (f *denyingFirewall) Outbound(netip.Addr) time.Time        { return time.Time{} }
func (f *denyingFirewall) OnDenied(fn func(string, lifecycle.EgressDecision)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.denied = fn
}

func (f *denyingFirewall) deny(id string, i int) {
	f.mu.Lock()
	fn := f.denied
	f.mu.Unlock()
	fn(id, lifecycle.EgressDecision{Addr: netip.AddrFrom4([4]byte{198, 51, 100, byte(1 + i%250)}), Port: uint16(1000 + i/250), Proto: "udp"})
}

// TestDenialFloodIsSummarised: a sandbox refused 10,000 destinations in a
// minute logs DeniedPerWindow sandbox.egress_denied events and then, once
// the minute ends, one summary counting the rest; another sandbox's
// denials during the flood are logged; the next minute starts over.
func TestDenialFloodIsSummarised(t *testing.T) {
	fw := &denyingFirewall{fakeFirewall: &fakeFirewall{entries: map[netip.Addr]lifecycle.FirewallEntry{}}}
	e, clock := newClockEnv(t, lifecycle.Config{Firewall: fw})
	e.seedWith(t, "flood", lifecycle.Running, func(r *lifecycle.Record) {
		r.Incarnation, r.Spec.Labels = "inc-flood", map[string]string{"tenant": "acme"}
	})
	e.seed(t, "quiet", lifecycle.Running)
	published := 0
	var pmu sync.Mutex
	e.hooks.onEvent(func(ev lifecycle.Event) {
		if ev.SandboxID == "flood" {
			pmu.Lock()
			published++
			pmu.Unlock()
		}
	})
	count := func(id, typ string) (n int, last lifecycle.Event) {
		for _, ev := range e.history(t, id) {
			if ev.Type == typ {
				n, last = n+1, ev
			}
		}
		return n, last
	}

	const flood = 10000
	for i := range flood {
		fw.deny("flood", i)
		if i == flood/2 {
			fw.deny("quiet", 0)
		}
	}
	if n, _ := count("flood", lifecycle.EventEgressDenied); n != lifecycle.DeniedPerWindow {
		t.Fatalf("%d egress_denied events of %d destinations, want %d", n, flood, lifecycle.DeniedPerWindow)
	}
	if n, last := count("quiet", lifecycle.EventEgressDenied); n != 1 || last.Reason != "198.51.100.1:1000/udp" {
		t.Fatalf("the other sandbox's denial during the flood: %d events, last %+v", n, last)
	}
	e.m.FlushDenials()
	if n, _ := count("flood", lifecycle.EventEgressDeniedSummary); n != 0 {
		t.Fatalf("a summary before the minute ended")
	}

	clock.at(lifecycle.DeniedWindow)
	e.m.FlushDenials()
	n, sum := count("flood", lifecycle.EventEgressDeniedSummary)
	if n != 1 || sum.Denials == nil {
		t.Fatalf("%d summaries after the minute (%+v), want 1 with its counts", n, sum)
	}
	d := sum.Denials
	if d.Logged != lifecycle.DeniedPerWindow || d.Suppressed != flood-lifecycle.DeniedPerWindow || !d.DestinationsEstimated ||
		d.Destinations < (flood-lifecycle.DeniedPerWindow)*95/100 || d.Destinations > (flood-lifecycle.DeniedPerWindow)*105/100 ||
		len(d.Top) != 5 || !d.From.Equal(testClock) || !d.Until.Equal(testClock.Add(lifecycle.DeniedWindow)) {
		t.Errorf("summary %+v", d)
	}
	if sum.Labels["tenant"] != "acme" || sum.Incarnation != "inc-flood" {
		t.Errorf("summary carries labels %v incarnation %q, want the sandbox's", sum.Labels, sum.Incarnation)
	}
	if want := fmt.Sprintf("%d denials of about %d destinations not logged in 1m0s (60 logged)", d.Suppressed, d.Destinations); sum.Reason != want {
		t.Errorf("reason %q, want %q", sum.Reason, want)
	}
	if n, _ := count("quiet", lifecycle.EventEgressDeniedSummary); n != 0 {
		t.Errorf("a summary for the sandbox that suppressed nothing")
	}
	if n := e.m.OpenDenialWindows(); n != 0 {
		t.Errorf("%d denial windows held after they ended", n)
	}
	pmu.Lock()
	if published != lifecycle.DeniedPerWindow+1 {
		t.Errorf("%d events of the flooding sandbox published, want %d", published, lifecycle.DeniedPerWindow+1)
	}
	pmu.Unlock()

	// The next minute: a destination logged before is logged again.
	fw.deny("flood", 0)
	if n, _ := count("flood", lifecycle.EventEgressDenied); n != lifecycle.DeniedPerWindow+1 {
		t.Errorf("%d egress_denied events after the next minute's first denial, want %d", n, lifecycle.DeniedPerWindow+1)
	}
}
