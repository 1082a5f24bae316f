package egress_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/lifecycle"
)

// These tests run in a network namespace of their own: the tables and
// bridges they make, and every table a sweep sees, are theirs only (the
// host's, and other gateways', are out of reach), and deleting the
// namespace removes them all, whatever the outcome.

// cleanupNS is a test's network namespace; the test's goroutine runs in it
// (enter) until the test ends.
type cleanupNS struct {
	t    *testing.T
	name string
}

// enterOwnNetns makes a network namespace and moves the test's goroutine
// (locked to its thread) into it; the test must call the returned leave
// with defer, first thing. Every socket the firewall opens on the test's
// goroutine (netlink, the forwarder's) is the namespace's.
func enterOwnNetns(t *testing.T) (*cleanupNS, func()) {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	ns := &cleanupNS{t: t, name: "swcl" + hex.EncodeToString(b)}
	run(t, "ip", "netns", "add", ns.name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns.name).Run() })
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	target, err := os.Open("/var/run/netns/" + ns.name)
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	return ns, func() {
		// A thread that cannot go back ends with the goroutine (still
		// locked), never to run other code in the namespace.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		orig.Close()
	}
}

// run runs a command in the namespace.
func (ns *cleanupNS) run(args ...string) {
	ns.t.Helper()
	run(ns.t, append([]string{"ip", "netns", "exec", ns.name}, args...)...)
}

// hasTable reports whether the namespace holds table family name.
func (ns *cleanupNS) hasTable(family, name string) bool {
	return exec.Command("ip", "netns", "exec", ns.name, "nft", "list", "table", family, name).Run() == nil
}

// bridgeTables makes both of sandwake's tables of bridge (empty ones:
// what is removed is a table, whatever it holds).
func (ns *cleanupNS) bridgeTables(bridge string) {
	ns.t.Helper()
	for _, family := range []string{"inet", "bridge"} {
		ns.run("nft", "add", "table", family, egress.TableName(bridge))
	}
}

// bridge makes a bridge interface.
func (ns *cleanupNS) bridge(name string) {
	ns.t.Helper()
	ns.run("ip", "link", "add", name, "type", "bridge")
}

func randomSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestSetupRemovesStaleTables: a firewall's Setup removes both tables of a
// bridge that no longer exists (its network removed while no gateway
// ran), and counts them; it leaves the tables of a bridge that exists
// (another instance's), probe tables and tables not named sandwake-*.
func TestSetupRemovesStaleTables(t *testing.T) {
	ns, leave := enterOwnNetns(t)
	defer leave()
	sfx := randomSuffix()
	gone, other, mine := "swg"+sfx, "swo"+sfx, "swm"+sfx
	ns.bridgeTables(gone) // as a gateway left them: its bridge went with its network
	ns.bridge(gone)
	ns.run("ip", "link", "del", gone)
	ns.bridge(other)
	ns.bridgeTables(other)
	probe := fmt.Sprintf("sandwake-probe-%d-%s", os.Getpid(), sfx)
	ns.run("nft", "add", "table", "inet", probe)
	foreign := "swforeign-" + sfx
	ns.run("nft", "add", "table", "inet", foreign)

	// The firewall of another bridge, as a gateway starts it.
	p := netip.MustParsePrefix("10.99.0.0/24")
	gw := p.Addr().Next()
	ns.bridge(mine)
	ns.run("ip", "addr", "add", netip.PrefixFrom(gw, p.Bits()).String(), "dev", mine)
	fw := egress.New(egress.Options{Resolvers: []netip.Addr{netip.MustParseAddr("192.0.2.53")}})
	t.Cleanup(func() { fw.Close() }) // before the namespace is deleted: its sockets hold it
	before := egress.TablesRemoved()
	n := lifecycle.SandboxNet{Name: "cleanup-" + sfx, Bridge: mine, Subnet: p, Gateway: gw, First: gw.Next(), Last: netip.MustParseAddr("10.99.0.200")}
	if err := fw.Setup(context.Background(), n); err != nil {
		t.Fatalf("setup: %v", err)
	}

	for _, family := range []string{"inet", "bridge"} {
		if ns.hasTable(family, egress.TableName(gone)) {
			t.Errorf("table %s %s of a bridge that is gone is still there after Setup", family, egress.TableName(gone))
		}
		if !ns.hasTable(family, egress.TableName(other)) {
			t.Errorf("table %s %s of a bridge that exists was removed", family, egress.TableName(other))
		}
		if !ns.hasTable(family, egress.TableName(mine)) {
			t.Errorf("table %s %s of the firewall's own bridge is missing", family, egress.TableName(mine))
		}
	}
	if !ns.hasTable("inet", probe) {
		t.Errorf("probe table %s was removed", probe)
	}
	if !ns.hasTable("inet", foreign) {
		t.Errorf("table %s, not sandwake's, was removed", foreign)
	}
	if got := egress.TablesRemoved() - before; got != 2 {
		t.Errorf("TablesRemoved grew by %d, want 2 (both tables of %s)", got, gone)
	}

	// Its own bridge gone (the network removed while it runs): the
	// firewall's RemoveStale takes its tables too, and a Setup on the
	// bridge made again installs them anew.
	ns.run("ip", "link", "del", mine)
	removed, err := fw.RemoveStale()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{"bridge " + egress.TableName(mine), "inet " + egress.TableName(mine)}; !slices.Equal(removed, want) {
		t.Errorf("RemoveStale answered %q, want %q", removed, want)
	}
	ns.bridge(mine)
	ns.run("ip", "addr", "add", netip.PrefixFrom(gw, p.Bits()).String(), "dev", mine)
	if err := fw.Setup(context.Background(), n); err != nil {
		t.Fatalf("setup on the bridge made again: %v", err)
	}
	if !ns.hasTable("inet", egress.TableName(mine)) || !ns.hasTable("bridge", egress.TableName(mine)) {
		t.Error("Setup on the bridge made again did not install its tables")
	}
}

// TestRemoveTables: a bridge's tables are removed once the bridge is gone,
// not while it exists; RemoveStaleTables answers what it removed.
func TestRemoveTables(t *testing.T) {
	ns, leave := enterOwnNetns(t)
	defer leave()
	sfx := randomSuffix()
	br, stale := "swr"+sfx, "sws"+sfx
	ns.bridge(br)
	ns.bridgeTables(br)
	if _, err := egress.RemoveTables(br); err == nil {
		t.Fatal("RemoveTables removed the tables of a bridge that exists")
	}
	if !ns.hasTable("inet", egress.TableName(br)) || !ns.hasTable("bridge", egress.TableName(br)) {
		t.Fatal("a refused RemoveTables removed a table")
	}
	ns.run("ip", "link", "del", br)
	removed, err := egress.RemoveTables(br)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"inet " + egress.TableName(br), "bridge " + egress.TableName(br)}
	if !slices.Equal(removed, want) {
		t.Errorf("RemoveTables answered %q, want %q", removed, want)
	}
	if removed, err := egress.RemoveTables(br); err != nil || len(removed) != 0 {
		t.Errorf("RemoveTables of tables gone already: %q, %v; want nothing, no error", removed, err)
	}

	ns.bridgeTables(stale)
	removed, err = egress.RemoveStaleTables(nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"inet " + egress.TableName(stale), "bridge " + egress.TableName(stale)}; !slices.Equal(removed, want) {
		t.Errorf("RemoveStaleTables answered %q, want %q", removed, want)
	}
}

// TestServing: a socket on port 53 of a network's gateway address (a
// gateway's forwarder) is seen; none, or one on another address, is not.
func TestServing(t *testing.T) {
	ns, leave := enterOwnNetns(t)
	defer leave()
	br := "swv" + randomSuffix()
	ns.bridge(br)
	ns.run("ip", "addr", "add", "10.99.0.1/24", "dev", br)
	ns.run("ip", "addr", "add", "10.99.1.1/24", "dev", br)
	gw, other := netip.MustParseAddr("10.99.0.1"), netip.MustParseAddr("10.99.1.1")
	if egress.Serving(gw) {
		t.Fatal("Serving with no socket on port 53")
	}
	pc, err := net.ListenPacket("udp4", "10.99.1.1:53")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if egress.Serving(gw) || !egress.Serving(other) {
		t.Fatalf("a socket on %s:53: Serving(%s) %v, Serving(%s) %v", other, gw, egress.Serving(gw), other, egress.Serving(other))
	}
}
