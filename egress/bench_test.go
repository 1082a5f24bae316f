package egress_test

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os/exec"
	"slices"
	"strconv"
	"testing"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// BenchmarkApply measures one sandbox's entry installed or replaced (one
// netlink batch: chain, rules, counter, map element), what a create adds
// with the firewall on. It runs on a bridge of its own, no Docker needed:
//
//	go test -run '^$' -bench Apply ./egress/
func BenchmarkApply(b *testing.B) {
	for _, c := range []struct {
		name  string
		allow []string
	}{
		{"addresses", []string{"198.51.100.7:443/tcp", "198.51.100.8"}},
		{"names", []string{"registry.npmjs.org", "*.githubusercontent.com:443"}},
	} {
		b.Run(c.name, func(b *testing.B) { benchApply(b, lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: c.allow}) })
	}
}

// benchBridge makes a bridge with the network's gateway address (where the
// forwarder listens), removed with its tables when the benchmark ends.
func benchBridge(b *testing.B, bridge, subnet string) lifecycle.SandboxNet {
	p := netip.MustParsePrefix(subnet)
	gw := p.Addr().Next()
	if out, err := exec.Command("ip", "link", "add", bridge, "type", "bridge").CombinedOutput(); err != nil {
		b.Skipf("making a bridge (needs root): %v %s", err, out)
	}
	b.Cleanup(func() {
		exec.Command("nft", "delete", "table", "inet", egress.TableName(bridge)).Run()
		exec.Command("nft", "delete", "table", "bridge", egress.TableName(bridge)).Run()
		exec.Command("ip", "link", "del", bridge).Run()
	})
	if out, err := exec.Command("ip", "addr", "add", netip.PrefixFrom(gw, p.Bits()).String(), "dev", bridge).CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	last := p.Addr().As4()
	last[2], last[3] = 239, 255
	return lifecycle.SandboxNet{Name: "bench", Bridge: bridge, Subnet: p, Gateway: gw, First: gw.Next(), Last: netip.AddrFrom4(last)}
}

func benchApply(b *testing.B, e lifecycle.Egress) {
	n := benchBridge(b, "swbench0", "10.77.0.0/16")
	fw := egress.New(egress.Options{Resolvers: []netip.Addr{netip.MustParseAddr("10.0.0.2")}})
	b.Cleanup(func() { fw.Close() })
	if err := fw.Setup(context.Background(), n); err != nil {
		b.Fatal(err)
	}
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
// chains hold, so it rewrites every entry, in one batch. Under names, each
// sandbox allows two names (two name sets each).
//
//	go test -run '^$' -bench SyncAfterRestart -benchtime 5x ./egress/
func BenchmarkSyncAfterRestart(b *testing.B) {
	for _, c := range []struct {
		name   string
		egress lifecycle.Egress
	}{
		{"addresses", lifecycle.Egress{Policy: lifecycle.EgressPublic}},
		{"names", lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"registry.npmjs.org", "*.githubusercontent.com:443"}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			const n = 2000
			sn := benchBridge(b, "swbench1", "10.78.0.0/16")
			entries := make([]lifecycle.FirewallEntry, n)
			addr := sn.First
			for i := range entries {
				entries[i] = lifecycle.FirewallEntry{ID: fmt.Sprintf("s%d", i), Address: addr, Egress: c.egress}
				addr = addr.Next()
			}
			fw := egress.New(egress.Options{Resolvers: []netip.Addr{}})
			if err := fw.Setup(context.Background(), sn); err != nil {
				b.Fatal(err)
			}
			if _, err := fw.Sync(entries); err != nil {
				b.Fatal(err)
			}
			fw.Close()
			for b.Loop() {
				restarted := egress.New(egress.Options{Resolvers: []netip.Addr{}})
				if err := restarted.Setup(context.Background(), sn); err != nil {
					b.Fatal(err)
				}
				if _, err := restarted.Sync(entries); err != nil {
					b.Fatal(err)
				}
				restarted.Close()
			}
		})
	}
}

// BenchmarkLookup measures a sandbox's lookup through the forwarder
// against one straight at the upstream, side by side: two gateways, one
// with the firewall (the sandbox, under none with the name allowed, asks
// the forwarder on its gateway, which asks the test's DNS server and
// writes the answer into the sandbox's set before it answers) and one
// unenforced (the sandbox asks the same kind of server directly).
// Rounds alternate; each reports p50 and p99 in µs and the difference.
//
//	SANDWAKE_REQUIRE_DOCKER=1 go test -run '^$' -bench Lookup -benchtime 5x ./egress/
func BenchmarkLookup(b *testing.B) {
	fwd := newNameRig(b, nil)
	direct := newNameRig(b, func(h *testHosts, c *lifecycle.Config) {
		*c = lifecycle.Config{Egress: lifecycle.EgressConfig{Unenforced: true}}
	})
	a := fwd.create(testenv.UniqueID("lkf"), lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"allowed.test"}})
	d := direct.create(testenv.UniqueID("lkd"), lifecycle.Egress{Policy: lifecycle.EgressPublic})
	const per = 1000
	var p50 [2][]float64
	var p99 [2][]float64
	for b.Loop() {
		for side, c := range []struct {
			r   *nameRig
			rec lifecycle.Record
			srv string
		}{{fwd, a, hp(fwd.net.Gateway, 53)}, {direct, d, hp(direct.hosts.private, 53)}} {
			code, body := c.r.get(c.rec, "/lookups", url.Values{"name": {"allowed.test"}, "n": {strconv.Itoa(per)}, "server": {c.srv}})
			var m50, m99, mean float64
			if _, err := fmt.Sscanf(body, "ok p50 %g p99 %g mean %g", &m50, &m99, &mean); code != 200 || err != nil {
				b.Fatalf("/lookups: %d %s", code, body)
			}
			p50[side] = append(p50[side], m50)
			p99[side] = append(p99[side], m99)
		}
	}
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(med(p50[1]), "direct-p50-µs")
	b.ReportMetric(med(p50[0]), "forwarder-p50-µs")
	b.ReportMetric(med(p50[0])-med(p50[1]), "added-p50-µs")
	b.ReportMetric(med(p99[1]), "direct-p99-µs")
	b.ReportMetric(med(p99[0]), "forwarder-p99-µs")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkFirstConnect runs the first-connect check at the size:
// 10,000 lookups, each answered with an address no set held before and
// followed at once by a connect; it reports how many were refused (the
// goal is 0).
//
//	SANDWAKE_REQUIRE_DOCKER=1 go test -run '^$' -bench FirstConnect -benchtime 1x ./egress/
func BenchmarkFirstConnect(b *testing.B) {
	r := newManyRig(b)
	for b.Loop() {
		refused, failed, body := firstConnects(b, r, 10000)
		if failed != 0 {
			b.Fatalf("lookups failed: %s", body)
		}
		b.ReportMetric(float64(refused), "refused")
		b.ReportMetric(10000, "connects")
	}
	b.ReportMetric(0, "ns/op")
}
