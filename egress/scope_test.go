package egress_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// These tests reproduce security IV's first finding: the bridge table of a
// sandbox network judged the frames of every bridge of the host by
// address, so another bridge on an overlapping subnet (a Docker network on
// a reused subnet, a plain bridge, CNI, libvirt) lost its traffic, while
// the gateway ran and after it stopped. Traffic goes only between
// namespaces and containers the tests make, on links they make.

// suffix is a random name suffix: interface names stay within 15 bytes.
func suffix() string {
	b := make([]byte, 3)
	rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// hostAt is the n-th address of subnet.
func hostAt(subnet netip.Prefix, n int) netip.Addr {
	a := subnet.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

// addBridge makes a bridge, up, removed when the test ends.
func addBridge(t *testing.T, name string) {
	t.Helper()
	run(t, "ip", "link", "add", name, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", name).Run() })
	run(t, "ip", "link", "set", name, "up")
}

// nsPort is a network namespace whose only link is a veth into a bridge
// (the host end is the bridge's port).
type nsPort struct {
	ns   string
	port string // the host end, a port of the bridge
	peer string // the namespace's end
	addr netip.Addr
}

// addNSPort makes a namespace with address addr/bits on a veth whose host
// end joins bridge; all removed when the test ends.
func addNSPort(t *testing.T, bridge string, addr netip.Addr, bits int) *nsPort {
	t.Helper()
	s := suffix()
	p := &nsPort{ns: "swsn" + s, port: "swsa" + s, peer: "swsb" + s, addr: addr}
	run(t, "ip", "netns", "add", p.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", p.ns).Run() })
	// IPv4 only: without this the namespace's link coming up sends IPv6
	// solicitations and reports of its own for seconds after, which a
	// counter of the bridge (a port bound to nothing is all spoofing) may
	// count in the middle of a test that watches it.
	run(t, "ip", "netns", "exec", p.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	run(t, "ip", "link", "add", p.port, "type", "veth", "peer", "name", p.peer)
	t.Cleanup(func() { exec.Command("ip", "link", "del", p.port).Run() })
	run(t, "ip", "link", "set", p.peer, "netns", p.ns)
	run(t, "ip", "-n", p.ns, "addr", "add", fmt.Sprintf("%s/%d", addr, bits), "dev", p.peer)
	run(t, "ip", "-n", p.ns, "link", "set", p.peer, "up")
	run(t, "ip", "-n", p.ns, "link", "set", "lo", "up")
	run(t, "ip", "link", "set", p.port, "master", bridge)
	run(t, "ip", "link", "set", p.port, "up")
	return p
}

// inNS runs fn on a thread in the namespace (sockets it opens are the
// namespace's).
func (p *nsPort) inNS(fn func() error) error { return (&testHosts{ns: p.ns}).inNS(fn) }

// mustBeOnLink fails the test unless the namespace reaches addr directly
// on its veth (no gateway, no other link): traffic stays on the test's
// bridge.
func (p *nsPort) mustBeOnLink(t *testing.T, addr netip.Addr) {
	t.Helper()
	out, err := exec.Command("ip", "-n", p.ns, "route", "get", addr.String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev "+p.peer) || strings.Contains(string(out), " via ") {
		t.Fatalf("%s is not on the link of namespace %s (%s): %s %v", addr, p.ns, p.peer, out, err)
	}
}

// tcpBetween opens a TCP connection from a to b over their bridge and
// exchanges a line; it returns the error, if any.
func tcpBetween(t *testing.T, a, b *nsPort) error {
	t.Helper()
	a.mustBeOnLink(t, b.addr)
	var l net.Listener
	if err := b.inNS(func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(b.addr, 0).String())
		return err
	}); err != nil {
		t.Fatalf("listening in %s: %v", b.ns, err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			echo(c)
		}
	}()
	return a.inNS(func() error {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		if line != "pong ping\n" {
			return fmt.Errorf("echo answered %q", line)
		}
		return nil
	})
}

// acceptForwarding lets the host's forward path pass frames between ports
// of bridge: Docker's FORWARD policy is drop, and br_netfilter hands
// bridged frames to it (Docker adds the same rule for its own networks).
func acceptForwarding(t *testing.T, bridge string) {
	t.Helper()
	rule := []string{"FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"}
	run(t, append([]string{"iptables", "-I"}, rule...)...)
	t.Cleanup(func() { exec.Command("iptables", append([]string{"-D"}, rule...)...).Run() })
}

// plainBridgeOn makes a plain Linux bridge with two namespaces on subnet
// (at its 10th and 11th addresses), the bridge holding no address of the
// host's.
func plainBridgeOn(t *testing.T, subnet netip.Prefix) (string, *nsPort, *nsPort) {
	t.Helper()
	br := "swpb" + suffix()
	addBridge(t, br)
	acceptForwarding(t, br)
	a := addNSPort(t, br, hostAt(subnet, 10), subnet.Bits())
	b := addNSPort(t, br, hostAt(subnet, 11), subnet.Bits())
	return br, a, b
}

// scopeFirewall sets a firewall up for a sandbox bridge of the test's own
// (a plain bridge holding the gateway address) on subnet. Cleanup closes
// it and removes its tables.
func scopeFirewall(t *testing.T, subnet netip.Prefix) (*egress.Firewall, lifecycle.SandboxNet) {
	t.Helper()
	br := "swgb" + suffix()
	addBridge(t, br)
	gw := hostAt(subnet, 1)
	run(t, "ip", "addr", "add", fmt.Sprintf("%s/%d", gw, subnet.Bits()), "dev", br)
	n := lifecycle.SandboxNet{Name: br, Bridge: br, Subnet: subnet, Gateway: gw, First: hostAt(subnet, 2), Last: hostAt(subnet, 200)}
	fw := egress.New(egress.Options{})
	t.Cleanup(func() {
		fw.Close()
		for _, family := range []string{"inet", "bridge"} {
			exec.Command("nft", "delete", "table", family, egress.TableName(br)).Run()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fw.Setup(ctx, n); err != nil {
		t.Fatalf("setting the firewall up on %s: %v", br, err)
	}
	return fw, n
}

// TestAnotherBridgeOnTheSubnetIsUntouched: while a gateway's firewall runs
// for its sandbox bridge on subnet S, a plain bridge of the host with two
// namespaces on S carries their traffic, and the bridge table counts none
// of it as spoofed. The inet table's loopback rule is the bridge's only.
func TestAnotherBridgeOnTheSubnetIsUntouched(t *testing.T) {
	subnet := netip.MustParsePrefix(testenv.SandboxSubnet())
	_, n := scopeFirewall(t, subnet)
	// A port of the sandbox bridge, bound to nothing: the table is in
	// force on it.
	addNSPort(t, n.Bridge, hostAt(subnet, 5), subnet.Bits())
	_, a, b := plainBridgeOn(t, subnet)
	before := spoofedCount(t, n.Bridge)
	for _, pair := range [][2]*nsPort{{a, b}, {b, a}} {
		if err := tcpBetween(t, pair[0], pair[1]); err != nil {
			t.Errorf("TCP from %s to %s on a plain bridge sharing the sandbox subnet %s: %v", pair[0].addr, pair[1].addr, subnet, err)
		}
	}
	if after := spoofedCount(t, n.Bridge); after != before {
		t.Errorf("the sandbox bridge's table counted %d frames of another bridge as spoofed", after-before)
	}
	pre := nft(t, "list", "chain", "inet", egress.TableName(n.Bridge), "prerouting")
	if !strings.Contains(pre, `iifname "`+n.Bridge+`"`) || strings.Contains(pre, `!= "lo"`) {
		t.Errorf("the loopback rule is not scoped to the sandbox bridge:\n%s", pre)
	}
}

// TestAStoppedGatewaysTablesLeaveOtherNetworksAlone: a gateway stopped
// with its tables left in the kernel (as Close leaves them, so that
// sandboxes stay bound through a restart) and its bridge's ports gone: a
// Docker network made afterwards on the same subnet carries its
// containers' traffic to each other, and so does a plain bridge with two
// namespaces.
func TestAStoppedGatewaysTablesLeaveOtherNetworksAlone(t *testing.T) {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	subnet := netip.MustParsePrefix(testenv.SandboxSubnet())
	fw, n := scopeFirewall(t, subnet)
	port := addNSPort(t, n.Bridge, hostAt(subnet, 5), subnet.Bits())
	// Its element is left behind by the stop (where the watch lists
	// ports; a stale table of an older release has none).
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		set := nft(t, "list", "set", "bridge", egress.TableName(n.Bridge), "ports")
		return strings.Contains(set, `"`+port.port+`"`), "port " + port.port + " in the ports set:\n" + set
	})
	if err := fw.Close(); err != nil {
		t.Fatal(err)
	}
	// The stopped gateway's tables stay; its port goes (a container
	// stopped), its bridge gives up the subnet's gateway address.
	nft(t, "list", "table", "bridge", egress.TableName(n.Bridge))
	nft(t, "list", "table", "inet", egress.TableName(n.Bridge))
	run(t, "ip", "netns", "del", port.ns)
	run(t, "ip", "addr", "flush", "dev", n.Bridge)
	before := spoofedCount(t, n.Bridge)

	_, a, b := plainBridgeOn(t, subnet)
	for _, pair := range [][2]*nsPort{{a, b}, {b, a}} {
		if err := tcpBetween(t, pair[0], pair[1]); err != nil {
			t.Errorf("TCP from %s to %s on a plain bridge, on the stopped gateway's subnet %s: %v", pair[0].addr, pair[1].addr, subnet, err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	netName := "sw-scope-" + suffix()
	res, err := cli.NetworkCreate(ctx, netName, client.NetworkCreateOptions{Driver: "bridge", Labels: testenv.Labels(),
		IPAM: &network.IPAM{Driver: "default", Config: []network.IPAMConfig{{Subnet: subnet, Gateway: hostAt(subnet, 1)}}}})
	if err != nil {
		t.Fatalf("creating a Docker network on %s: %v", subnet, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cli.NetworkRemove(ctx, res.ID, client.NetworkRemoveOptions{})
	})
	addrs := []netip.Addr{hostAt(subnet, 20), hostAt(subnet, 21)}
	for i, addr := range addrs {
		name := fmt.Sprintf("sw-scope-%s-%d", suffix(), i)
		_, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name,
			Config:     &container.Config{Image: image, Labels: testenv.Labels()},
			HostConfig: &container.HostConfig{NetworkMode: container.NetworkMode(netName)},
			NetworkingConfig: &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
				netName: {IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: addr}},
			}},
		})
		if err != nil {
			t.Fatalf("creating container %s: %v", name, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cli.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true})
		})
		if _, err := cli.ContainerStart(ctx, name, client.ContainerStartOptions{}); err != nil {
			t.Fatalf("starting container %s: %v", name, err)
		}
	}
	// The host reaches the first container on the Docker network's
	// bridge, directly.
	out, err := exec.Command("ip", "route", "get", addrs[0].String()).CombinedOutput()
	if err != nil || strings.Contains(string(out), " via ") || strings.Contains(string(out), "dev "+n.Bridge) || !strings.Contains(string(out), "dev br-") {
		t.Fatalf("%s is not on the link of the test's Docker network: %s %v", addrs[0], out, err)
	}
	get := func(url string) (string, error) {
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(url)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return "", fmt.Errorf("%d %s", resp.StatusCode, body)
		}
		return string(body), nil
	}
	for _, addr := range addrs {
		var err error
		testenv.Eventually(t, 20*time.Second, func() (bool, string) {
			_, err = get("http://" + netip.AddrPortFrom(addr, 8080).String() + "/healthz")
			return err == nil, fmt.Sprintf("the host reaching container %s on the Docker network: %v", addr, err)
		})
	}
	first := "http://" + netip.AddrPortFrom(addrs[0], 8080).String()
	second := "http://" + netip.AddrPortFrom(addrs[1], 8080).String() + "/healthz"
	body, err := get(first + "/fetch?url=" + second)
	if err != nil || !strings.HasPrefix(body, "ok 200") {
		t.Errorf("container %s fetching %s (container to container): %q %v", addrs[0], second, body, err)
	}
	if after := spoofedCount(t, n.Bridge); after != before {
		t.Errorf("the stopped gateway's table counted %d frames of other networks as spoofed", after-before)
	}
}

// TestThePortsSetFollowsTheBridge: the bridge table's ports set holds
// every port of the sandbox bridge, bound or not, and none other: a link
// joining the bridge enters it, one leaving it (for no bridge, or for
// another) or deleted leaves it, with no call of the firewall between.
func TestThePortsSetFollowsTheBridge(t *testing.T) {
	subnet := netip.MustParsePrefix(testenv.SandboxSubnet())
	fw, n := scopeFirewall(t, subnet)
	inSet := func(port string) bool {
		return strings.Contains(nft(t, "list", "set", "bridge", egress.TableName(n.Bridge), "ports"), `"`+port+`"`)
	}
	want := func(port string, in bool, what string) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, func() (bool, string) { return inSet(port) == in, what })
	}
	p := addNSPort(t, n.Bridge, hostAt(subnet, 5), subnet.Bits())
	want(p.port, true, "a new port of the sandbox bridge in the ports set")
	other := "swob" + suffix()
	addBridge(t, other)
	q := addNSPort(t, other, hostAt(subnet, 6), subnet.Bits())
	run(t, "ip", "link", "set", p.port, "nomaster")
	want(p.port, false, "a port that left the sandbox bridge out of the ports set")
	run(t, "ip", "link", "set", p.port, "master", n.Bridge)
	want(p.port, true, "a port that joined the sandbox bridge again in the ports set")
	run(t, "ip", "link", "set", p.port, "master", other)
	want(p.port, false, "a port moved to another bridge out of the ports set")
	if inSet(q.port) {
		t.Errorf("a port of another bridge (%s) is in the ports set", q.port)
	}
	run(t, "ip", "link", "set", q.port, "master", n.Bridge)
	want(q.port, true, "a port moved from another bridge in the ports set")
	run(t, "ip", "link", "del", q.port)
	want(q.port, false, "a deleted port out of the ports set")

	// Close stops the watch: a port joining after it is not listed
	// (the set is what it was), until the next gateway's Setup lists the
	// bridge. A closed firewall sets nothing up again.
	if err := fw.Close(); err != nil {
		t.Fatal(err)
	}
	r := addNSPort(t, n.Bridge, hostAt(subnet, 7), subnet.Bits())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fw.Setup(ctx, n); err == nil {
		t.Errorf("Setup after Close succeeded: it may start what no Close stops")
	}
	fw2 := egress.New(egress.Options{})
	t.Cleanup(func() { fw2.Close() })
	if err := fw2.Setup(ctx, n); err != nil {
		t.Fatal(err)
	}
	if !inSet(r.port) {
		t.Errorf("a port that joined while the firewall was closed is not in the ports set after Setup")
	}
}

// TestAnOlderGatewaysRulesAreRescoped: tables an older release left (the
// bridge table's rules judging every bridge's frames by address, the
// loopback rule on every interface) are rewritten at Setup to the rules
// scoped to the sandbox bridge, the bindings they held kept (the sandboxes
// run on).
func TestAnOlderGatewaysRulesAreRescoped(t *testing.T) {
	subnet := netip.MustParsePrefix(testenv.SandboxSubnet())
	fw, n := scopeFirewall(t, subnet)
	if err := fw.Close(); err != nil {
		t.Fatal(err)
	}
	table := egress.TableName(n.Bridge)
	bound := hostAt(subnet, 5)
	old := fmt.Sprintf(`delete table bridge %[1]s
table bridge %[1]s {
	counter spoofed { }
	set bound { type ifname . ether_addr . ipv4_addr; elements = { "swold0" . 02:42:0a:00:00:05 . %[2]s } }
	set ports { type ifname; elements = { "swold0" } }
	set portmacs { type ifname . ether_addr; elements = { "swold0" . 02:42:0a:00:00:05 } }
	set macs { type ether_addr; elements = { 02:42:0a:00:00:05 } }
	chain prerouting {
		type filter hook prerouting priority -300; policy accept;
		ether type ip ip saddr %[3]s iifname . ether saddr . ip saddr != @bound counter name "spoofed" drop
		ether saddr @macs iifname . ether saddr != @portmacs counter name "spoofed" drop
	}
}
flush chain inet %[1]s prerouting
add rule inet %[1]s prerouting iifname != "lo" ip daddr 127.0.0.0/8 counter name "loopback" drop
`, table, bound, subnet)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(old)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("writing an older release's rules: %v\n%s", err, out)
	}
	// A gateway of this release starts.
	fw2 := egress.New(egress.Options{})
	t.Cleanup(func() { fw2.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fw2.Setup(ctx, n); err != nil {
		t.Fatal(err)
	}
	pre := nft(t, "list", "chain", "bridge", table, "prerouting")
	for _, line := range strings.Split(pre, "\n") {
		if strings.Contains(line, "drop") && !strings.Contains(line, "iif @ports") {
			t.Errorf("a rule of the bridge table not scoped to the bridge's ports after Setup: %s", strings.TrimSpace(line))
		}
	}
	if !strings.Contains(nft(t, "list", "set", "bridge", table, "bound"), bound.String()) {
		t.Errorf("the binding of %s was lost rewriting the bridge table", bound)
	}
	if lo := nft(t, "list", "chain", "inet", table, "prerouting"); !strings.Contains(lo, `iifname "`+n.Bridge+`"`) || strings.Contains(lo, `!= "lo"`) {
		t.Errorf("the loopback rule is not scoped to the sandbox bridge after Setup:\n%s", lo)
	}
}
