package egress_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// These tests run sandboxes on the real Docker engine behind the real
// firewall in this kernel. Traffic goes only to the test's own hosts (in a
// network namespace it makes) and to a listener on the sandbox network's
// gateway address; metadata and the other ranges are checked in the
// installed rules.

func TestMain(m *testing.M) { testenv.Main(m) }

type rig struct {
	t     testing.TB
	eng   *engine.Engine
	mgr   *lifecycle.Manager
	hosts *testHosts
	net   lifecycle.SandboxNet
	image string
}

// newRig opens an engine with the firewall on, over a network of its own,
// and the test's hosts. cfg may name the hosts (it gets them first).
func newRig(t testing.TB, cfg func(h *testHosts) lifecycle.Config) *rig {
	t.Helper()
	cli := testenv.Docker(t)
	r := &rig{t: t, image: testenv.TestAppImage(t), hosts: newTestHosts(t)}
	mc := lifecycle.Config{}
	if cfg != nil {
		mc = cfg(r.hosts)
	}
	if mc.Firewall == nil && !mc.Egress.Unenforced {
		mc.Firewall = egress.New(egress.Options{Deny: mc.Egress.Deny})
	}
	instance := testenv.UniqueID("eg")
	eng, err := engine.Open(engine.Options{
		Dir: t.TempDir(), Instance: instance, Labels: testenv.Labels(),
		SandboxSubnet: netip.MustParsePrefix(testenv.SandboxSubnet()), StopTimeout: 2 * time.Second,
		Manager: mc,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.eng, r.mgr = eng, eng.Manager
	t.Cleanup(func() {
		eng.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		testenv.RemoveInstance(ctx, cli, instance) // containers, network and its table
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.mgr.EgressStatus(ctx); err != nil && !mc.Egress.Unenforced {
		t.Fatalf("egress status: %v", err)
	}
	nr := r.mgr.Runtime().(lifecycle.NetworkRuntime)
	if r.net, err = nr.SandboxNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) create(id string, e lifecycle.Egress) lifecycle.Record {
	r.t.Helper()
	return r.createEnv(id, e, nil)
}

func (r *rig) createEnv(id string, e lifecycle.Egress, env map[string]string) lifecycle.Record {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := r.mgr.Create(ctx, lifecycle.CreateRequest{ID: id, Spec: lifecycle.Spec{Image: r.image, Ports: []int{8080}, Egress: e, Env: env}})
	if err != nil {
		r.t.Fatalf("create %s: %v", id, err)
	}
	if !r.net.Subnet.Contains(rec.Address) {
		r.t.Fatalf("sandbox %s has address %s, not in the sandbox network %s", id, rec.Address, r.net.Subnet)
	}
	return rec
}

// dial asks the sandbox to connect to addr: true when it got an echo back.
func (r *rig) dial(rec lifecycle.Record, addr string, proto string) (bool, string) {
	r.t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://%s/dial?addr=%s&proto=%s", rec.Upstreams[8080], addr, proto))
	if err != nil {
		r.t.Fatalf("asking sandbox %s to dial %s: %v", rec.ID, addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == 200 && strings.HasPrefix(string(body), "ok "), strings.TrimSpace(string(body))
}

func (r *rig) mustReach(rec lifecycle.Record, addr, proto string) {
	r.t.Helper()
	if ok, body := r.dial(rec, addr, proto); !ok {
		r.t.Errorf("sandbox %s (%s) could not reach %s/%s: %s", rec.ID, rec.Spec.Egress.Policy, addr, proto, body)
	}
}

func (r *rig) mustNotReach(rec lifecycle.Record, addr, proto string) {
	r.t.Helper()
	if ok, body := r.dial(rec, addr, proto); ok {
		r.t.Errorf("sandbox %s (%s) reached %s/%s: %s", rec.ID, rec.Spec.Egress.Policy, addr, proto, body)
	}
}

func hp(a netip.Addr, port int) string { return netip.AddrPortFrom(a, uint16(port)).String() }

func nft(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("nft", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestPublicReachesTheInternetOnly(t *testing.T) {
	r := newRig(t, nil)
	rec := r.create(testenv.UniqueID("pub"), lifecycle.Egress{Policy: lifecycle.EgressPublic})
	gwPort, gwAccepted := hostListener(t, r.net.Gateway)

	r.mustReach(rec, hp(r.hosts.internet, r.hosts.port), "tcp")
	r.mustReach(rec, hp(r.hosts.internet, r.hosts.port), "udp")
	before := r.hosts.accepted.Load()
	r.mustNotReach(rec, hp(r.hosts.private, r.hosts.port), "tcp")
	r.mustNotReach(rec, hp(r.hosts.private, r.hosts.port), "udp")
	r.mustNotReach(rec, hp(r.net.Gateway, gwPort), "tcp")
	if n := r.hosts.accepted.Load() - before; n != 0 {
		t.Errorf("the private host accepted %d connections", n)
	}
	if n := gwAccepted.Load(); n != 0 {
		t.Errorf("the host's listener on %s accepted %d connections from the sandbox", r.net.Gateway, n)
	}
	if n := r.mgr.EgressDenied(rec.ID, 0); n < 3 {
		t.Errorf("denied counter %d, want at least the 3 refused attempts", n)
	}
	// Metadata and the other ranges are never sent to: the installed set
	// says they are denied, with the host's own addresses.
	set := nft(t, "list", "set", "inet", egress.TableName(r.net.Bridge), "denied")
	for _, want := range []string{"10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "0.0.0.0/8", "224.0.0.0/3"} {
		if !strings.Contains(set, want) {
			t.Errorf("denied set lacks %s:\n%s", want, set)
		}
	}
	for _, a := range egress.HostAddresses() {
		if in := slicesContainsPrefixOf(set, a.Addr()); !in {
			t.Errorf("denied set does not cover the host address %s:\n%s", a.Addr(), set)
		}
	}
}

// slicesContainsPrefixOf reports whether the nft listing names a or a
// range holding it (merged ranges are listed as CIDRs).
func slicesContainsPrefixOf(listing string, a netip.Addr) bool {
	for _, f := range strings.FieldsFunc(listing, func(r rune) bool { return r == ' ' || r == ',' || r == '{' || r == '}' || r == '\n' || r == '\t' }) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Contains(a) {
			return true
		}
		if b, err := netip.ParseAddr(f); err == nil && b == a {
			return true
		}
	}
	return false
}

func TestNoneReachesNothingButServesPreviews(t *testing.T) {
	r := newRig(t, nil)
	rec := r.create(testenv.UniqueID("none"), lifecycle.Egress{Policy: lifecycle.EgressNone})
	r.mustNotReach(rec, hp(r.hosts.internet, r.hosts.port), "tcp")
	r.mustNotReach(rec, hp(r.hosts.internet, r.hosts.port), "udp")
	if r.hosts.accepted.Load() != 0 {
		t.Errorf("the internet host accepted %d connections", r.hosts.accepted.Load())
	}
	resp, err := http.Get("http://" + rec.Upstreams[8080] + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("preview traffic into a none sandbox: %d", resp.StatusCode)
	}
	chain := nft(t, "list", "chain", "inet", egress.TableName(r.net.Bridge), "sb-"+rec.ID)
	// DNS goes to the forwarder on the gateway only.
	for _, line := range strings.Split(chain, "\n") {
		if strings.Contains(line, "dport 53 accept") && !strings.Contains(line, "ip daddr "+r.net.Gateway.String()+" ") {
			t.Errorf("a none sandbox's chain lets DNS through elsewhere than the forwarder (%s):\n%s", r.net.Gateway, chain)
		}
	}
	if !strings.Contains(chain, "ip daddr "+r.net.Gateway.String()+" udp dport 53 accept") {
		t.Errorf("a none sandbox's chain does not open the forwarder (%s:53):\n%s", r.net.Gateway, chain)
	}
	// Ingress around the gateway (moby#45610, moby#41872): read from the
	// installed rules, no packet is sent from elsewhere.
	// A sandbox's frames for 127.0.0.0/8 are dropped before DNAT; a LAN
	// peer's, DNATed to a published port, are a new connection routed
	// into the bridge, which the forward chain drops (below). Only the
	// bridge's traffic is judged: other interfaces are not sandwake's.
	pre := nft(t, "list", "chain", "inet", egress.TableName(r.net.Bridge), "prerouting")
	if !strings.Contains(pre, fmt.Sprintf(`iifname %q`, r.net.Bridge)) || !strings.Contains(pre, "127.0.0.0/8") || !strings.Contains(pre, "drop") || !strings.Contains(pre, "hook prerouting") {
		t.Errorf("no drop of 127.0.0.0/8 from the sandbox bridge before DNAT:\n%s", pre)
	}
	fwd := nft(t, "list", "chain", "inet", egress.TableName(r.net.Bridge), "forward")
	want := fmt.Sprintf(`oifname %q iifname != %q ct direction original ct state new`, r.net.Bridge, r.net.Bridge)
	if !strings.Contains(fwd, want) {
		t.Errorf("no drop of new connections routed into the bridge from outside (want %q):\n%s", want, fwd)
	}
}

func TestAllowListOpensExactlyWhatItLists(t *testing.T) {
	var private netip.Addr
	r := newRig(t, func(h *testHosts) lifecycle.Config {
		private = h.private
		return lifecycle.Config{Egress: lifecycle.EgressConfig{AllowPrivate: []lifecycle.AllowRule{{Prefix: netip.PrefixFrom(h.private, 32), Proto: "tcp"}}}}
	})
	h := r.hosts
	// An entry inside a denied range that the operator did not open is
	// refused, and nothing is made.
	ctx := context.Background()
	_, err := r.mgr.Create(ctx, lifecycle.CreateRequest{ID: testenv.UniqueID("bad"), Spec: lifecycle.Spec{Image: r.image, Ports: []int{8080},
		Egress: lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{hp(private, h.port) + "/udp"}}}})
	if !errors.Is(err, lifecycle.ErrInvalid) || !strings.Contains(err.Error(), "egress_allow_private") {
		t.Fatalf("allow entry in a denied range: %v, want invalid naming egress_allow_private", err)
	}
	rec := r.create(testenv.UniqueID("allow"), lifecycle.Egress{Policy: lifecycle.EgressNone,
		Allow: []string{hp(private, h.port), hp(h.internet, h.port) + "/udp"}})
	r.mustReach(rec, hp(private, h.port), "tcp")
	r.mustNotReach(rec, hp(private, h.port2), "tcp")
	r.mustNotReach(rec, hp(private, h.port), "udp")
	r.mustReach(rec, hp(h.internet, h.port), "udp")
	r.mustNotReach(rec, hp(h.internet, h.port), "tcp")
}

func TestUpdateFlipsARunningSandbox(t *testing.T) {
	r := newRig(t, nil)
	h := r.hosts
	rec := r.create(testenv.UniqueID("flip"), lifecycle.Egress{Policy: lifecycle.EgressPublic})
	// A connection opened under public is held open by the app.
	held := make(chan string, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("http://%s/dial?addr=%s&hold=60s", rec.Upstreams[8080], hp(h.internet, h.port)))
		if err != nil {
			held <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		held <- string(b)
	}()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return h.accepted.Load() == 1, "the held connection to arrive"
	})
	if _, err := r.mgr.Update(rec.ID, lifecycle.Patch{Egress: &lifecycle.Egress{Policy: lifecycle.EgressNone}}); err != nil {
		t.Fatal(err)
	}
	// In force when Update returns: no wait before the next dial.
	r.mustNotReach(rec, hp(h.internet, h.port), "tcp")
	select {
	case got := <-held:
		if !strings.HasPrefix(got, "cut after") {
			t.Errorf("held connection after the switch to none: %q, want it cut", got)
		}
	case <-time.After(30 * time.Second):
		t.Error("the held connection was not cut by the switch to none")
	}
	if _, err := r.mgr.Update(rec.ID, lifecycle.Patch{Egress: &lifecycle.Egress{Policy: lifecycle.EgressPublic}}); err != nil {
		t.Fatal(err)
	}
	r.mustReach(rec, hp(h.internet, h.port), "tcp")
	got, err := r.mgr.Get(rec.ID)
	if err != nil || got.Spec.Egress.Policy != lifecycle.EgressPublic {
		t.Errorf("record after the flips: %+v %v", got.Spec.Egress, err)
	}
}

func TestAnAddressReusedCarriesNoRules(t *testing.T) {
	r := newRig(t, func(h *testHosts) lifecycle.Config {
		return lifecycle.Config{Egress: lifecycle.EgressConfig{AllowPrivate: []lifecycle.AllowRule{{Prefix: netip.PrefixFrom(h.private, 32), Proto: "tcp"}}}}
	})
	h := r.hosts
	a := r.create(testenv.UniqueID("old"), lifecycle.Egress{Policy: lifecycle.EgressPublic, Allow: []string{hp(h.private, h.port)}})
	r.mustReach(a, hp(h.private, h.port), "tcp")
	ctx := context.Background()
	if err := r.mgr.Destroy(ctx, a.ID, "test"); err != nil {
		t.Fatal(err)
	}
	b := r.create(testenv.UniqueID("new"), lifecycle.Egress{Policy: lifecycle.EgressNone})
	if b.Address != a.Address {
		t.Fatalf("the new sandbox got %s, the destroyed one had %s: the reuse under test did not happen", b.Address, a.Address)
	}
	r.mustNotReach(b, hp(h.private, h.port), "tcp")
	r.mustNotReach(b, hp(h.internet, h.port), "tcp")
	chains := nft(t, "list", "chains", "inet")
	if strings.Contains(chains, "sb-"+a.ID) {
		t.Errorf("the destroyed sandbox's chain is still installed:\n%s", chains)
	}
}

func TestReconcileReinstallsTheTable(t *testing.T) {
	r := newRig(t, func(*testHosts) lifecycle.Config {
		return lifecycle.Config{ReconcileInterval: 300 * time.Millisecond}
	})
	h := r.hosts
	rec := r.create(testenv.UniqueID("fix"), lifecycle.Egress{Policy: lifecycle.EgressPublic})
	if err := r.mgr.Start(); err != nil {
		t.Fatal(err)
	}
	table := egress.TableName(r.net.Bridge)
	nft(t, "delete", "table", "inet", table)
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		out, err := exec.Command("nft", "list", "chain", "inet", table, "sb-"+rec.ID).CombinedOutput()
		return err == nil, "the table and the sandbox's chain back: " + string(out)
	})
	r.mustReach(rec, hp(h.internet, h.port), "tcp")
	r.mustNotReach(rec, hp(h.private, h.port), "tcp")
	// A stray entry (a sandbox gone behind the gateway's back) is removed.
	nft(t, "add", "chain", "inet", table, "sb-stray")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		out, _ := exec.Command("nft", "list", "chains", "inet").CombinedOutput()
		return !strings.Contains(string(out), "sb-stray"), "the stray chain removed"
	})
}

// TestWithoutPrivilegeNothingStarts runs a gateway's engine in a process
// without CAP_NET_ADMIN: creates fail with ErrEgressUnenforced naming the
// fix, and nothing is left behind.
func TestWithoutPrivilegeNothingStarts(t *testing.T) {
	if os.Getenv("SANDWAKE_EGRESS_UNPRIVILEGED") == "1" {
		unprivileged(t)
		return
	}
	testenv.Docker(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed to drop CAP_NET_ADMIN: %v", err)
	}
	cmd := exec.Command(setpriv, "--bounding-set", "-net_admin", "--inh-caps", "-net_admin", "--",
		os.Args[0], "-test.run", "^TestWithoutPrivilegeNothingStarts$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "SANDWAKE_EGRESS_UNPRIVILEGED=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("unprivileged run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "CAP_NET_ADMIN") {
		t.Errorf("the refusal does not name CAP_NET_ADMIN:\n%s", out)
	}
}

func unprivileged(t *testing.T) {
	image := testenv.TestAppImage(t)
	eng, err := engine.Open(engine.Options{
		Dir: t.TempDir(), Instance: testenv.UniqueID("np"), Labels: testenv.Labels(),
		SandboxSubnet: netip.MustParsePrefix(testenv.SandboxSubnet()),
		Manager:       lifecycle.Config{Firewall: egress.New(egress.Options{})},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	id := testenv.UniqueID("np")
	_, err = eng.Manager.Create(context.Background(), lifecycle.CreateRequest{ID: id, Spec: lifecycle.Spec{Image: image, Ports: []int{8080}}})
	if !errors.Is(err, lifecycle.ErrEgressUnenforced) {
		t.Fatalf("create without CAP_NET_ADMIN: %v, want ErrEgressUnenforced", err)
	}
	t.Log(err)
	if _, err := eng.Manager.Get(id); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Errorf("a refused create left a record: %v", err)
	}
	if err := eng.Manager.EgressStatus(context.Background()); !errors.Is(err, lifecycle.ErrEgressUnenforced) {
		t.Errorf("egress status: %v", err)
	}
}

// TestTheFirstPacketMeetsItsPolicy: the app's very first connection, made
// before it even listens, already meets the sandbox's rules: allowed at
// once under public (no SYN lost to a missing entry), refused at once
// under none. There is no window between start and rules.
func TestTheFirstPacketMeetsItsPolicy(t *testing.T) {
	r := newRig(t, nil)
	target := hp(r.hosts.internet, r.hosts.port)
	for _, tc := range []struct {
		policy string
		want   string
	}{{lifecycle.EgressPublic, "ok "}, {lifecycle.EgressNone, "failed "}} {
		rec := r.createEnv(testenv.UniqueID("first"), lifecycle.Egress{Policy: tc.policy}, map[string]string{"DIAL_AT_START": target})
		resp, err := http.Get("http://" + rec.Upstreams[8080] + "/startdial")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got := strings.TrimSpace(string(b))
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: the app's first connection: %q, want %q…", tc.policy, got, tc.want)
		}
		if tc.policy == lifecycle.EgressNone && !strings.Contains(got, "refused") {
			t.Errorf("none: the first connection was not refused at once (rejected) but %q", got)
		}
		t.Logf("%s: first connection %s", tc.policy, got)
	}
}

// TestChurnKeepsEntriesExact: creates and destroys race with the
// reconcile's firewall sync (and reuse addresses meanwhile); afterwards the
// kernel's map holds exactly one entry per sandbox, each pointing at its
// own chain, and no chain of a sandbox gone.
func TestChurnKeepsEntriesExact(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	stop := make(chan struct{})
	synced := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				synced <- n
				return
			default:
			}
			if _, err := r.mgr.SyncFirewall(ctx); err != nil {
				t.Errorf("sync: %v", err)
			}
			n++
		}
	}()
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				id := testenv.UniqueID(fmt.Sprintf("c%d%d", w, i))
				rec, err := r.mgr.Create(ctx, lifecycle.CreateRequest{ID: id, Spec: lifecycle.Spec{Image: r.image, Ports: []int{8080},
					Egress: lifecycle.Egress{Policy: []string{lifecycle.EgressPublic, lifecycle.EgressNone}[i%2]}}})
				if err != nil {
					t.Errorf("create: %v", err)
					return
				}
				if i%2 == 0 { // keep some, destroy the others
					if err := r.mgr.Destroy(ctx, rec.ID, "test"); err != nil {
						t.Errorf("destroy: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	t.Logf("%d firewall syncs ran during the churn", <-synced)

	recs, err := r.mgr.List("")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, rec := range recs {
		want[rec.Address.String()] = "sb-" + rec.ID
	}
	out, err := exec.Command("nft", "-j", "list", "map", "inet", egress.TableName(r.net.Bridge), "sandboxes").Output()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Nftables []struct {
			Map *struct {
				Elem [][2]json.RawMessage `json:"elem"`
			} `json:"map"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, n := range doc.Nftables {
		if n.Map == nil {
			continue
		}
		for _, e := range n.Map.Elem {
			var addr string
			var v struct {
				Jump struct {
					Target string `json:"target"`
				} `json:"jump"`
			}
			json.Unmarshal(e[0], &addr)
			json.Unmarshal(e[1], &v)
			got[addr] = v.Jump.Target
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("kernel map after the churn:\n got  %v\n want %v", got, want)
	}
	chains := nft(t, "list", "chains", "inet")
	for _, line := range strings.Split(chains, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "chain" && strings.HasPrefix(f[1], "sb-") && !slices.Contains(slices.Collect(maps.Values(want)), f[1]) &&
			strings.Contains(f[1], testenv.RunID()) {
			t.Errorf("chain %s of a sandbox gone is still installed", f[1])
		}
	}
}

// TestWakeAfterALostTable: the host's tables are gone (a reboot) while the
// gateway was down; a wake before any firewall sync installs the sandbox's
// entry again, so its app never runs unguarded.
func TestWakeAfterALostTable(t *testing.T) {
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	hosts := newTestHosts(t)
	dir, instance := t.TempDir(), testenv.UniqueID("eg")
	subnet := netip.MustParsePrefix(testenv.SandboxSubnet())
	open := func() *engine.Engine {
		eng, err := engine.Open(engine.Options{Dir: dir, Instance: instance, Labels: testenv.Labels(), SandboxSubnet: subnet,
			StopTimeout: 2 * time.Second, Manager: lifecycle.Config{Firewall: egress.New(egress.Options{})}})
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		testenv.RemoveInstance(ctx, cli, instance)
	})
	ctx := context.Background()
	eng := open()
	id := testenv.UniqueID("lost")
	if _, err := eng.Manager.Create(ctx, lifecycle.CreateRequest{ID: id, Spec: lifecycle.Spec{Image: image, Ports: []int{8080}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Manager.Stop(ctx, id, "test"); err != nil {
		t.Fatal(err)
	}
	n, err := eng.Manager.Runtime().(lifecycle.NetworkRuntime).SandboxNetwork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eng.Close()
	nft(t, "delete", "table", "inet", egress.TableName(n.Bridge))

	eng = open()
	defer eng.Close()
	rec, err := eng.Manager.Wake(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, hosts: hosts, net: n, image: image}
	r.mustReach(rec, hp(hosts.internet, hosts.port), "tcp")
	r.mustNotReach(rec, hp(hosts.private, hosts.port), "tcp")
}
