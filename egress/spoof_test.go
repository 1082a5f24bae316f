package egress_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// createCaps creates a sandbox with capabilities given back.
func (r *rig) createCaps(id string, e lifecycle.Egress, caps ...string) lifecycle.Record {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := r.mgr.Create(ctx, lifecycle.CreateRequest{ID: id, Spec: lifecycle.Spec{Image: r.image, Ports: []int{8080}, Egress: e, CapAdd: caps}})
	if err != nil {
		r.t.Fatalf("create %s: %v", id, err)
	}
	return rec
}

// ask calls an endpoint of the sandbox's app and fails unless it answers 200.
func (r *rig) ask(rec lifecycle.Record, path string, q url.Values) string {
	r.t.Helper()
	resp, err := http.Get("http://" + rec.Upstreams[8080] + path + "?" + q.Encode())
	if err != nil {
		r.t.Fatalf("%s of sandbox %s: %v", path, rec.ID, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		r.t.Fatalf("%s of sandbox %s: %d %s", path, rec.ID, resp.StatusCode, body)
	}
	return string(body)
}

// spoofedCount reads the bridge table's counter of dropped frames.
func spoofedCount(t *testing.T, bridge string) int {
	t.Helper()
	out := nft(t, "list", "counter", "bridge", egress.TableName(bridge), "spoofed")
	f := strings.Fields(out[strings.Index(out, "packets"):])
	n, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("reading the spoofed counter: %q", out)
	}
	return n
}

// neighbourMAC is the host's neighbour entry for addr on dev ("" : none).
func neighbourMAC(t *testing.T, addr netip.Addr, dev string) string {
	t.Helper()
	out, err := exec.Command("ip", "neigh", "show", addr.String(), "dev", dev).CombinedOutput()
	if err != nil {
		t.Fatalf("ip neigh: %v %s", err, out)
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "lladdr" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

// TestASandboxOwnsOnlyItsAddress reproduces security III's third finding:
// sandbox A (policy none, NET_RAW given back) sends UDP with sandbox B's
// source address (B is public) to a host of the test's own, and a
// gratuitous ARP claiming B's address. Neither may leave A's port: the test
// host gets nothing from A (B's own raw datagrams, sent before and after,
// arrive; the host masquerades what leaves for the test host, so
// datagrams are told apart by payload), the bridge table counts the drops, and the host's neighbour
// entry for B keeps B's MAC.
func TestASandboxOwnsOnlyItsAddress(t *testing.T) {
	r := newRig(t, nil)
	b := r.createCaps(testenv.UniqueID("sb"), lifecycle.Egress{Policy: lifecycle.EgressPublic}, "NET_RAW")
	a := r.createCaps(testenv.UniqueID("sa"), lifecycle.Egress{Policy: lifecycle.EgressNone}, "NET_RAW")
	dst := hp(r.hosts.internet, r.hosts.port)
	// The test host is ours, in our namespace, behind our veth: check that
	// the route to it is that veth before anything is sent there.
	if out, err := exec.Command("ip", "route", "get", r.hosts.internet.String()).CombinedOutput(); err != nil || !strings.Contains(string(out), "dev "+r.hosts.veth) {
		t.Fatalf("the test host %s is not behind the test's veth %s: %s %v", r.hosts.internet, r.hosts.veth, out, err)
	}
	send := func(from lifecycle.Record, src netip.Addr, payload string) {
		r.ask(from, "/raw", url.Values{"src": {src.String()}, "dst": {dst}, "payload": {payload}})
	}
	// B's own raw datagram arrives: the raw path works.
	send(b, b.Address, "from-b-1")
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return r.hosts.receivedPayload("from-b-1"), "B's raw datagram to the test host"
	})

	before := spoofedCount(t, r.net.Bridge)
	send(a, b.Address, "spoofed-by-a")
	send(b, b.Address, "from-b-2")
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return r.hosts.receivedPayload("from-b-2"), "B's second datagram"
	})
	if r.hosts.receivedPayload("spoofed-by-a") {
		t.Fatalf("A's datagram with B's source address reached the test host")
	}
	if n := spoofedCount(t, r.net.Bridge); n <= before {
		t.Fatalf("A's datagram was not counted as spoofed (%d, before %d)", n, before)
	}

	// The host talks to B (its neighbour entry for B is made), then A
	// claims B's address.
	if ok, body := r.dial(b, hp(r.hosts.internet, r.hosts.port), "tcp"); !ok {
		t.Fatalf("B reaching the test host: %s", body)
	}
	macB := neighbourMAC(t, b.Address, r.net.Bridge)
	if macB == "" {
		// The host reaches B through Docker's proxy or directly; either
		// way an entry exists once it has answered.
		t.Fatalf("the host has no neighbour entry for B (%s)", b.Address)
	}
	before = spoofedCount(t, r.net.Bridge)
	r.ask(a, "/garp", url.Values{"ip": {b.Address.String()}})
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return spoofedCount(t, r.net.Bridge) > before, "A's gratuitous ARP counted as spoofed"
	})
	if got := neighbourMAC(t, b.Address, r.net.Bridge); got != macB {
		t.Fatalf("the host's neighbour entry for B moved from %s to %s after A's gratuitous ARP", macB, got)
	}
	// B still works, both ways.
	r.mustReach(b, hp(r.hosts.internet, r.hosts.port), "tcp")
	// A is still held to none.
	r.mustNotReach(a, hp(r.hosts.internet, r.hosts.port), "udp")
}

// localListener listens on addr:0 with IP_FREEBIND (an address made local
// by a route rather than assigned to an interface).
func localListener(t *testing.T, addr netip.Addr) (int, *atomic.Int64) {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_IP, syscall.IP_FREEBIND, 1) })
		return serr
	}}
	l, err := lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted := new(atomic.Int64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port, accepted
}

// mustBeLocal fails the test unless the kernel routes addr to this host.
func mustBeLocal(t *testing.T, addr netip.Addr) {
	t.Helper()
	out, err := exec.Command("ip", "route", "get", addr.String()).CombinedOutput()
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(out)), "local "+addr.String()) {
		t.Fatalf("%s is not local to this host: %s %v", addr, out, err)
	}
}

// TestHostAddressesByKind reproduces security III's fourth finding: an
// address added to the host after the gateway started, and a range made
// local by a route (AnyIP), are the host's at once: a public sandbox
// reaches neither, with no reconcile in between.
func TestHostAddressesByKind(t *testing.T) {
	r := newRig(t, nil)
	rec := r.create(testenv.UniqueID("pub"), lifecycle.Egress{Policy: lifecycle.EgressPublic})
	x := r.hosts.internet.As4()
	// Addresses of 198.19.0.0/16 (the benchmarking range, which public
	// allows), on the test's own veth and route.
	added := netip.AddrFrom4([4]byte{198, 19, x[2], x[3] + 1})
	run(t, "ip", "addr", "add", added.String()+"/32", "dev", r.hosts.veth)
	anyIP := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, x[2], x[3] + 3}), 32)
	run(t, "ip", "route", "add", "local", anyIP.String(), "dev", "lo")
	t.Cleanup(func() { exec.Command("ip", "route", "del", "local", anyIP.String(), "dev", "lo").Run() })
	mustBeLocal(t, added)
	mustBeLocal(t, anyIP.Addr())
	for _, a := range []netip.Addr{added, anyIP.Addr()} {
		port, accepted := localListener(t, a)
		before := r.mgr.EgressDenied(rec.ID, 0)
		r.mustNotReach(rec, hp(a, port), "tcp")
		if n := accepted.Load(); n != 0 {
			t.Errorf("the host's listener on %s accepted %d connections from a public sandbox", a, n)
		}
		if n := r.mgr.EgressDenied(rec.ID, 0); n <= before {
			t.Errorf("the attempt at %s was not counted against the sandbox (%d, before %d)", a, n, before)
		}
	}
}

// TestAStoppedSandboxRefusesAtOnce: the host's own connections to the
// address of a sandbox whose container stopped behind sandwake's back are
// refused at once (a reset from the output path), not left to time out on
// ARP: in upstream mode direct the gateway's dial fails fast and the
// request is held through a wake. A running sandbox's address answers.
func TestAStoppedSandboxRefusesAtOnce(t *testing.T) {
	r := newRig(t, nil)
	rec := r.create(testenv.UniqueID("st"), lifecycle.Egress{Policy: lifecycle.EgressNone})
	addr := rec.Upstreams[8080]
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err != nil {
		t.Fatalf("the running sandbox at %s: %v", addr, err)
	} else {
		c.Close()
	}
	cli := testenv.Docker(t)
	secs := 1
	if _, err := cli.ContainerStop(context.Background(), "s-"+rec.ID, client.ContainerStopOptions{Timeout: &secs}); err != nil {
		t.Fatal(err)
	}
	// What the events stream or the periodic reconcile does in a gateway.
	if _, err := r.mgr.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, err := r.mgr.Get(rec.ID); err != nil || got.State != lifecycle.Stopped {
		t.Fatalf("after the reconcile: %+v %v, want stopped", got.State, err)
	}
	_, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialling the stopped sandbox's address: %v, want connection refused at once", err)
	}
}

// boundPort is the bridge port the kernel's bound set ties addr to, ""
// when it holds no element for addr (read with nft, as an operator would).
func boundPort(t *testing.T, bridge string, addr netip.Addr) string {
	t.Helper()
	out := nft(t, "list", "set", "bridge", egress.TableName(bridge), "bound")
	// elements = { "veth1a2b3c4" . 02:42:ac:1c:00:02 . 172.28.0.2, … }
	for _, el := range strings.FieldsFunc(out, func(r rune) bool { return r == ',' || r == '{' || r == '}' || r == '\n' }) {
		parts := strings.Split(el, " . ")
		if len(parts) == 3 && strings.TrimSpace(parts[2]) == addr.String() {
			return strings.Trim(strings.TrimSpace(parts[0]), `"`)
		}
	}
	return ""
}

// TestABindingFollowsEveryStart: a running sandbox's address is bound in
// the kernel to its bridge port, the host end of its veth; a stop unbinds
// it (nothing speaks for the address while it sleeps), and a wake binds it
// to the new port Docker made for that start, before the app answers.
func TestABindingFollowsEveryStart(t *testing.T) {
	r := newRig(t, nil)
	rec := r.create(testenv.UniqueID("bd"), lifecycle.Egress{Policy: lifecycle.EgressNone})
	first := boundPort(t, r.net.Bridge, rec.Address)
	if first == "" {
		t.Fatalf("running sandbox %s at %s: no binding in the kernel", rec.ID, rec.Address)
	}
	if _, err := net.InterfaceByName(first); err != nil {
		t.Fatalf("the bound port %s is no interface of this host: %v", first, err)
	}
	ctx := context.Background()
	if _, err := r.mgr.Stop(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	if p := boundPort(t, r.net.Bridge, rec.Address); p != "" {
		t.Fatalf("stopped sandbox %s: its address is still bound to %s", rec.ID, p)
	}
	woken, err := r.mgr.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	second := boundPort(t, r.net.Bridge, rec.Address)
	if second == "" || second == first {
		t.Fatalf("woken sandbox %s: bound to %q, want the new start's port (the first start's was %s)", rec.ID, second, first)
	}
	if _, err := net.InterfaceByName(second); err != nil {
		t.Fatalf("the bound port %s is no interface of this host: %v", second, err)
	}
	if _, err := net.InterfaceByName(first); err == nil {
		t.Errorf("the first start's port %s still exists after the stop", first)
	}
	r.ask(woken, "/healthz", nil)
}

// TestAWakeFromPausedKeepsItsContainer: a wake from paused leaves the record
// saying the container resolves through the forwarder, so the firewall
// entry is not rewritten at the next wake (that cost a 10 ms netlink commit
// and opened the host's resolvers to the sandbox, as for a container made
// before the forwarder), and a stop then a wake starts the same container
// again rather than make it anew (which loses what the app wrote outside
// its workspace).
func TestAWakeFromPausedKeepsItsContainer(t *testing.T) {
	r := newRig(t, nil)
	rec := r.create(testenv.UniqueID("pw"), lifecycle.Egress{Policy: lifecycle.EgressNone})
	if !rec.DNSForwarded {
		t.Fatalf("created %s: not recorded as resolving through the forwarder", rec.ID)
	}
	ctx := context.Background()
	if _, err := r.mgr.Pause(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	woken, err := r.mgr.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !woken.DNSForwarded {
		t.Errorf("after a wake from paused %s is recorded as not resolving through the forwarder", rec.ID)
	}
	if _, err := r.mgr.Stop(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	woken, err = r.mgr.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if woken.ContainerID != rec.ContainerID || woken.Reason != "wake" {
		t.Errorf("a stop and a wake after a wake from paused: container %.12s (%s), want %.12s started again", woken.ContainerID, woken.Reason, rec.ContainerID)
	}
	r.ask(woken, "/healthz", nil)

	// A record an earlier release left saying otherwise (its wake from
	// paused forgot it): the wake asks the engine, starts the same
	// container, and records what the engine says.
	if _, err := r.mgr.Stop(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.eng.Store().Update(rec.ID, func(r *lifecycle.Record) error { r.DNSForwarded = false; return nil }); err != nil {
		t.Fatal(err)
	}
	woken, err = r.mgr.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if woken.ContainerID != rec.ContainerID || !woken.DNSForwarded {
		t.Errorf("a wake of a record that forgot its forwarder: container %.12s (%s), forwarded %v; want %.12s started again, forwarded", woken.ContainerID, woken.Reason, woken.DNSForwarded, rec.ContainerID)
	}
	r.ask(woken, "/healthz", nil)
}
