package egress

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// TestReadersDoNotWaitForACommit: while a sandbox's set writes are being
// committed (sb.mu held across netlink), the forwarder still judges its
// other queries and the log reader still names a packet's address: the
// one NFLOG reader serves every sandbox.
func TestReadersDoNotWaitForACommit(t *testing.T) {
	sb := newSandbox("x")
	a := netip.MustParseAddr("198.51.100.7")
	sb.mu.Lock()
	sb.setRules(lifecycle.FirewallEntry{ID: "x", Egress: lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"api.example.com"}}})
	sb.remember("api.example.com", []netip.Addr{a}, time.Now().Add(time.Minute), time.Now())
	// sb.mu stays held: a commit under way.
	done := make(chan string, 2)
	go func() {
		policy, allowed, _ := sb.judge("api.example.com")
		if policy != lifecycle.EgressNone || !allowed {
			done <- "judge: wrong answer"
			return
		}
		done <- ""
	}()
	go func() { done <- "name " + sb.nameOf(a) }()
	for range 2 {
		select {
		case got := <-done:
			if got != "" && got != "name api.example.com" {
				t.Error(got)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a reader waited for the commit's lock")
		}
	}
	sb.mu.Unlock()
}
