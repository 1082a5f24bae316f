package egress_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/lifecycle"
)

// BenchmarkApply measures one sandbox's entry installed or replaced (one
// netlink batch: chain, rules, counter, map element), what a create adds
// with the firewall on. It runs on a bridge of its own, no Docker needed:
//
//	go test -run '^$' -bench Apply ./egress/
func BenchmarkApply(b *testing.B) {
	const bridge = "swbench0"
	if out, err := exec.Command("ip", "link", "add", bridge, "type", "bridge").CombinedOutput(); err != nil {
		b.Skipf("making a bridge (needs root): %v %s", err, out)
	}
	b.Cleanup(func() {
		exec.Command("nft", "delete", "table", "inet", egress.TableName(bridge)).Run()
		exec.Command("nft", "delete", "table", "bridge", egress.TableName(bridge)).Run()
		exec.Command("ip", "link", "del", bridge).Run()
	})
	fw := egress.New(egress.Options{Resolvers: []netip.Addr{netip.MustParseAddr("10.0.0.2")}})
	n := lifecycle.SandboxNet{Name: "bench", Bridge: bridge, Subnet: netip.MustParsePrefix("10.77.0.0/16"),
		Gateway: netip.MustParseAddr("10.77.0.1"), First: netip.MustParseAddr("10.77.0.2"), Last: netip.MustParseAddr("10.77.239.255")}
	if err := fw.Setup(context.Background(), n); err != nil {
		b.Fatal(err)
	}
	e := lifecycle.Egress{Policy: lifecycle.EgressPublic, Allow: []string{"198.51.100.7:443/tcp"}}
	addr := n.First
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := fw.Apply(lifecycle.FirewallEntry{ID: fmt.Sprintf("b%d", i%1000), Address: addr, Egress: e}); err != nil {
			b.Fatal(err)
		}
		if addr = addr.Next(); addr == n.Last {
			addr = n.First
		}
	}
}

// BenchmarkSyncAfterRestart measures a gateway's first firewall sync after
// a restart with 2,000 sandboxes installed: it does not know what the
// chains hold, so it rewrites every entry, in one batch.
//
//	go test -run '^$' -bench SyncAfterRestart -benchtime 5x ./egress/
func BenchmarkSyncAfterRestart(b *testing.B) {
	const bridge, n = "swbench1", 2000
	if out, err := exec.Command("ip", "link", "add", bridge, "type", "bridge").CombinedOutput(); err != nil {
		b.Skipf("making a bridge (needs root): %v %s", err, out)
	}
	b.Cleanup(func() {
		exec.Command("nft", "delete", "table", "inet", egress.TableName(bridge)).Run()
		exec.Command("nft", "delete", "table", "bridge", egress.TableName(bridge)).Run()
		exec.Command("ip", "link", "del", bridge).Run()
	})
	sn := lifecycle.SandboxNet{Name: "bench", Bridge: bridge, Subnet: netip.MustParsePrefix("10.78.0.0/16"),
		Gateway: netip.MustParseAddr("10.78.0.1"), First: netip.MustParseAddr("10.78.0.2"), Last: netip.MustParseAddr("10.78.239.255")}
	entries := make([]lifecycle.FirewallEntry, n)
	addr := sn.First
	for i := range entries {
		entries[i] = lifecycle.FirewallEntry{ID: fmt.Sprintf("s%d", i), Address: addr, Egress: lifecycle.Egress{Policy: lifecycle.EgressPublic}}
		addr = addr.Next()
	}
	fw := egress.New(egress.Options{Resolvers: []netip.Addr{}})
	if err := fw.Setup(context.Background(), sn); err != nil {
		b.Fatal(err)
	}
	if _, err := fw.Sync(entries); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		restarted := egress.New(egress.Options{Resolvers: []netip.Addr{}})
		if err := restarted.Setup(context.Background(), sn); err != nil {
			b.Fatal(err)
		}
		if _, err := restarted.Sync(entries); err != nil {
			b.Fatal(err)
		}
	}
}
