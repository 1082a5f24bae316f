package egress_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// nameRig is a rig whose firewall's upstream resolver is the test's own
// DNS server, with TTL bounds short enough to watch them run out.
type nameRig struct {
	*rig
	dns  *dnsHost
	zone map[string]record
}

func newNameRig(t testing.TB, mc func(h *testHosts, c *lifecycle.Config)) *nameRig {
	t.Helper()
	nr := &nameRig{}
	nr.rig = newRig(t, func(h *testHosts) lifecycle.Config {
		nr.zone = map[string]record{
			"allowed.test":     {addr: h.internet, ttl: 1},
			"other.test":       {addr: h.internet2, ttl: 1},
			"private.test":     {addr: h.private, ttl: 1},
			"cname.test":       {target: "edge.cdn.test", ttl: 1},
			"edge.cdn.test":    {addr: h.internet2, ttl: 1},
			"a.b.wild.test":    {addr: h.internet2, ttl: 1},
			"wild.test":        {addr: h.internet2, ttl: 1},
			"direct.test":      {addr: h.internet, ttl: 1},
			"long.test":        {addr: h.internet, ttl: 3600},
			"metadata.test":    {addr: netip.MustParseAddr("169.254.169.254"), ttl: 1},
			"unlisted.test":    {addr: h.internet, ttl: 1},
			"learned-a.test":   {addr: h.internet, ttl: 1},
			"learned-b.test":   {addr: h.internet2, ttl: 1},
			"not-learned.test": {addr: h.internet2, ttl: 1},
		}
		nr.dns = h.serveDNS(t, nr.zone)
		c := lifecycle.Config{Firewall: egress.New(egress.Options{Resolvers: []netip.Addr{h.private}, MinTTL: time.Second, MaxTTL: 2 * time.Second})}
		if mc != nil {
			mc(h, &c)
		}
		return c
	})
	return nr
}

// get asks the sandbox's app path with query q.
func (r *rig) get(rec lifecycle.Record, path string, q url.Values) (int, string) {
	r.t.Helper()
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://%s%s?%s", rec.Upstreams[8080], path, q.Encode()))
	if err != nil {
		r.t.Fatalf("asking sandbox %s %s: %v", rec.ID, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// lookup has the sandbox resolve name through its resolv.conf.
func (r *rig) lookup(rec lifecycle.Record, name string) (bool, string) {
	code, body := r.get(rec, "/lookup", url.Values{"name": {name}})
	return code == 200, body
}

// setHolds reports whether the sandbox's allow set for key (like "t0")
// holds addr, as the kernel lists it.
func (r *rig) setHolds(id, key string, addr netip.Addr) bool {
	r.t.Helper()
	out := nft(r.t, "list", "set", "inet", egress.TableName(r.net.Bridge), "na-"+id+"-"+key)
	return strings.Contains(out, addr.String()+" ")
}

func TestNamesOpenWhatTheyName(t *testing.T) {
	r := newNameRig(t, nil)
	h := r.hosts
	port := h.port
	a := r.create(testenv.UniqueID("names"), lifecycle.Egress{Policy: lifecycle.EgressNone,
		Allow: []string{"allowed.test", fmt.Sprintf("cname.test:%d/tcp", port), "*.wild.test", "private.test", "metadata.test"}})

	// Before any lookup the name's address is closed like any other.
	r.mustNotReach(a, hp(h.internet, port), "tcp")
	t.Run("a bare name opens tcp and udp", func(t *testing.T) {
		r.mustReach(a, fmt.Sprintf("allowed.test:%d", port), "tcp")
		r.mustReach(a, fmt.Sprintf("allowed.test:%d", h.port2), "tcp")
		r.mustReach(a, fmt.Sprintf("allowed.test:%d", port), "udp")
	})
	t.Run("a name not allowed is not asked and opens nothing", func(t *testing.T) {
		if ok, body := r.lookup(a, "other.test"); ok || !strings.Contains(body, "no such host") {
			t.Errorf("under none, other.test looked up: %s", body)
		}
		if n := r.dns.asked("other.test"); n != 0 {
			t.Errorf("the upstream was asked other.test %d times under none", n)
		}
		r.mustNotReach(a, hp(h.internet2, port), "tcp")
	})
	t.Run("a CNAME chain is followed, port and protocol narrow", func(t *testing.T) {
		r.mustReach(a, fmt.Sprintf("cname.test:%d", port), "tcp")
		r.mustNotReach(a, fmt.Sprintf("cname.test:%d", h.port2), "tcp")
		r.mustNotReach(a, fmt.Sprintf("cname.test:%d", port), "udp")
	})
	t.Run("a wildcard matches subdomains at any depth, not the name", func(t *testing.T) {
		r.mustReach(a, fmt.Sprintf("a.b.wild.test:%d", port), "tcp")
		if ok, body := r.lookup(a, "wild.test"); ok {
			t.Errorf("*.wild.test let wild.test resolve: %s", body)
		}
	})
	t.Run("an answer in a denied range opens nothing", func(t *testing.T) {
		if ok, body := r.lookup(a, "private.test"); !ok || !strings.Contains(body, h.private.String()) {
			t.Fatalf("private.test: %s", body)
		}
		r.mustNotReach(a, fmt.Sprintf("private.test:%d", port), "tcp")
		if ok, body := r.lookup(a, "metadata.test"); !ok {
			t.Fatalf("metadata.test: %s", body)
		}
		if r.setHolds(a.ID, "t0", netip.MustParseAddr("169.254.169.254")) {
			t.Errorf("169.254.169.254 entered the set of an allowed name")
		}
	})
	t.Run("DNS to anyone but the forwarder is refused", func(t *testing.T) {
		before := r.dns.asked("direct.test")
		for _, proto := range []string{"udp", "tcp"} {
			code, body := r.get(a, "/lookup", url.Values{"name": {"direct.test"}, "server": {hp(h.private, 53)}, "proto": {proto}})
			if code == 200 {
				t.Errorf("the sandbox asked the upstream directly over %s: %s", proto, body)
			}
		}
		if n := r.dns.asked("direct.test") - before; n != 0 {
			t.Errorf("the upstream got %d queries straight from the sandbox", n)
		}
		// Under public, a resolver at an address the policy lets
		// through: only the DNS rules stand between them (ports 53 and
		// 853 go to the forwarder alone).
		other := h.serveDNSAt(t, h.internet, map[string]record{"direct.test": {addr: h.internet, ttl: 1}})
		pub := r.create(testenv.UniqueID("namespub"), lifecycle.Egress{Policy: lifecycle.EgressPublic})
		r.mustReach(pub, hp(h.internet, port), "tcp") // the address itself is open
		for _, proto := range []string{"udp", "tcp"} {
			code, body := r.get(pub, "/lookup", url.Values{"name": {"direct.test"}, "server": {hp(h.internet, 53)}, "proto": {proto}})
			if code == 200 {
				t.Errorf("a public sandbox asked a resolver of its own over %s: %s", proto, body)
			}
		}
		if n := other.asked("direct.test"); n != 0 {
			t.Errorf("the public sandbox's own resolver got %d queries", n)
		}
	})

	b := r.create(testenv.UniqueID("namesb"), lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"other.test"}})
	t.Run("an address reached by name stays its sandbox's alone", func(t *testing.T) {
		r.mustReach(a, fmt.Sprintf("allowed.test:%d", port), "tcp")
		r.mustNotReach(b, hp(h.internet, port), "tcp")
		r.mustReach(b, fmt.Sprintf("other.test:%d", port), "tcp")
	})

	t.Run("an address leaves the set after its TTL unless looked up again", func(t *testing.T) {
		if ok, body := r.lookup(a, "allowed.test"); !ok {
			t.Fatalf("allowed.test: %s", body)
		}
		if !r.setHolds(a.ID, "t0", h.internet) {
			t.Fatalf("the answer is not in the set after the lookup")
		}
		testenv.Eventually(t, 15*time.Second, func() (bool, string) {
			return !r.setHolds(a.ID, "t0", h.internet), "the address is still in the set after a 1s TTL (bounds 1s..2s)"
		})
		r.mustNotReach(a, hp(h.internet, port), "tcp")
		r.mustReach(a, fmt.Sprintf("allowed.test:%d", port), "tcp")
	})

	t.Run("an open connection keeps its address past the TTL", func(t *testing.T) {
		// 4s of traffic, past the TTL (1s) and the upper bound (2s).
		code, body := r.get(a, "/dial", url.Values{"addr": {fmt.Sprintf("allowed.test:%d", port)}, "hold": {"4s"}})
		if code != 200 || !strings.HasPrefix(body, "held") {
			t.Errorf("a connection to an allowed name was cut while open: %d %s", code, body)
		}
	})

	t.Run("a PATCH that removes a name is in force at once and cuts its connections", func(t *testing.T) {
		done := make(chan string, 1)
		accepted := h.accepted.Load()
		go func() {
			_, body := r.get(a, "/dial", url.Values{"addr": {fmt.Sprintf("allowed.test:%d", port)}, "hold": {"6s"}})
			done <- body
		}()
		// The hold is up once the host accepted its connection.
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			return h.accepted.Load() != accepted, "the held connection never reached the host"
		})
		start := time.Now()
		if _, err := r.mgr.Update(a.ID, lifecycle.Patch{Egress: &lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"*.wild.test"}}}); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		r.mustNotReach(a, hp(h.internet, port), "tcp")
		if body := <-done; !strings.HasPrefix(body, "cut after") {
			t.Errorf("the connection of the name removed was not cut: %s", body)
		}
		t.Logf("PATCH in force %v after it was sent", took)
		if took > time.Second {
			t.Errorf("the PATCH took %v to be in force (want under 1s)", took)
		}
	})

	t.Run("the log tells what was tried", func(t *testing.T) {
		log, err := r.mgr.EgressLog(a.ID)
		if err != nil {
			t.Fatal(err)
		}
		lk := func(name string) *lifecycle.EgressLookup {
			i := slices.IndexFunc(log.Lookups, func(x lifecycle.EgressLookup) bool { return x.Name == name })
			if i < 0 {
				return nil
			}
			return &log.Lookups[i]
		}
		if x := lk("allowed.test"); x == nil || !x.Allowed || !slices.Contains(x.Addrs, h.internet) {
			t.Errorf("lookup of allowed.test: %+v", x)
		}
		if x := lk("other.test"); x == nil || x.Allowed {
			t.Errorf("lookup of other.test: %+v", x)
		}
		var allowed, denied bool
		for _, d := range log.Decisions {
			if d.Addr == h.internet && d.Port == uint16(port) && d.Proto == "tcp" && d.Allowed && d.Name == "allowed.test" {
				allowed = true
			}
			if d.Addr == h.internet2 && d.Port == uint16(port) && d.Proto == "tcp" && !d.Allowed {
				denied = true
			}
		}
		if !allowed || !denied {
			t.Errorf("decisions: allowed connection to allowed.test %v, denied %s:%d %v:\n%+v", allowed, h.internet2, port, denied, log.Decisions)
		}
		evs, err := r.mgr.EventsAfter(0, 10000)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(evs, func(e lifecycle.Event) bool {
			return e.Type == lifecycle.EventEgressDenied && e.SandboxID == a.ID && strings.HasPrefix(e.Reason, hp(h.internet2, port))
		}) {
			t.Errorf("no sandbox.egress_denied event for %s", hp(h.internet2, port))
		}
	})
}

func TestLearnThenLock(t *testing.T) {
	r := newNameRig(t, nil)
	h := r.hosts
	rec := r.create(testenv.UniqueID("learn"), lifecycle.Egress{Policy: lifecycle.EgressLearn})
	r.mustReach(rec, fmt.Sprintf("learned-a.test:%d", h.port), "tcp")
	r.mustReach(rec, fmt.Sprintf("learned-b.test:%d", h.port), "udp")
	r.mustReach(rec, fmt.Sprintf("learned-a.test:%d", h.port2), "tcp")
	// The activity flush keeps what it learned in its record (a learn
	// spanning a gateway restart loses nothing).
	if err := r.mgr.FlushActivity(); err != nil {
		t.Fatal(err)
	}
	if kept, err := r.mgr.Get(rec.ID); err != nil || !slices.Equal(kept.EgressLearned, []string{"learned-a.test", "learned-b.test"}) {
		t.Fatalf("the record keeps %v (%v), want learned-a.test and learned-b.test", kept.EgressLearned, err)
	}
	if _, err := r.mgr.LockEgress(testenv.UniqueID("nosuch")); err == nil {
		t.Errorf("a lock of an unknown sandbox succeeded")
	}
	locked, err := r.mgr.LockEgress(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"learned-a.test", "learned-b.test"}; locked.Spec.Egress.Policy != lifecycle.EgressNone || !slices.Equal(locked.Spec.Egress.Allow, want) {
		t.Fatalf("locked to %s %v, want none %v", locked.Spec.Egress.Policy, locked.Spec.Egress.Allow, want)
	}
	r.mustReach(rec, fmt.Sprintf("learned-a.test:%d", h.port), "tcp")
	r.mustReach(rec, fmt.Sprintf("learned-b.test:%d", h.port), "udp")
	if ok, body := r.lookup(rec, "not-learned.test"); ok {
		t.Errorf("after the lock a name it never used resolves: %s", body)
	}
	if _, err := r.mgr.LockEgress(rec.ID); err == nil {
		t.Errorf("a second lock (not learning) succeeded")
	}
}

func TestDenyByNameUnderPublic(t *testing.T) {
	r := newNameRig(t, nil)
	h := r.hosts
	rec := r.create(testenv.UniqueID("deny"), lifecycle.Egress{Policy: lifecycle.EgressPublic, Deny: []string{"other.test", hp(h.internet, h.port2)}})
	if ok, body := r.lookup(rec, "other.test"); ok {
		t.Errorf("a denied name resolved: %s", body)
	}
	// Its addresses are refused for the answer's TTL (deny wins over the
	// public policy, and over an allowed name on the same address).
	r.mustNotReach(rec, hp(h.internet2, h.port), "tcp")
	r.mustReach(rec, fmt.Sprintf("allowed.test:%d", h.port), "tcp")
	r.mustNotReach(rec, hp(h.internet, h.port2), "tcp")
}

// TestOutboundWorkCountsAsActivity: under activity any, a sandbox holding
// an outbound connection is not paused for idleness; the default is.
func TestOutboundWorkCountsAsActivity(t *testing.T) {
	r := newNameRig(t, func(h *testHosts, c *lifecycle.Config) {
		c.IdlePause = 500 * time.Millisecond
	})
	h := r.hosts
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	busy, err := r.mgr.Create(ctx, lifecycle.CreateRequest{ID: testenv.UniqueID("actany"), Spec: lifecycle.Spec{Image: r.image, Ports: []int{8080}, Activity: lifecycle.ActivityAny}})
	if err != nil {
		t.Fatal(err)
	}
	plain := r.create(testenv.UniqueID("actin"), lifecycle.Egress{Policy: lifecycle.EgressPublic})
	accepted := h.accepted.Load()
	holds := []chan string{make(chan string, 1), make(chan string, 1)}
	for i, rec := range []lifecycle.Record{busy, plain} {
		go func() {
			c := &http.Client{Timeout: 20 * time.Second}
			resp, err := c.Get(fmt.Sprintf("http://%s/dial?addr=%s&hold=8s", rec.Upstreams[8080], url.QueryEscape(fmt.Sprintf("long.test:%d", h.port))))
			if err != nil {
				holds[i] <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			holds[i] <- string(b)
		}()
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return h.accepted.Load() >= accepted+2, "the held connections never reached the host"
	})
	state := func(id string) lifecycle.State {
		rec, err := r.mgr.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		return rec.State
	}
	pausedByReaper := func(id, what string) func() (bool, string) {
		return func() (bool, string) {
			if _, err := r.mgr.ReapOnce(ctx); err != nil {
				t.Fatal(err)
			}
			return state(id) != lifecycle.Running, what
		}
	}
	testenv.Eventually(t, 7*time.Second, pausedByReaper(plain.ID, "the inbound-only sandbox was not paused after its last request (idle_pause 500ms)"))
	if s := state(busy.ID); s != lifecycle.Running {
		t.Fatalf("the sandbox under activity any holding an outbound connection is %s", s)
	}
	if body := <-holds[0]; !strings.HasPrefix(body, "held") {
		t.Errorf("the held connection of the busy sandbox: %s", body)
	}
	// Its work done, it sleeps like any other.
	testenv.Eventually(t, 15*time.Second, pausedByReaper(busy.ID, "the sandbox under activity any was not paused after its outbound work ended"))
}

// TestActiveMaxBoundsOutboundWork: outbound work keeps a sandbox under
// activity any awake only up to active_max past its last request: one
// holding a connection open far longer still runs past idle_pause, and is
// paused once active_max (2s here) has passed, the connection still held.
func TestActiveMaxBoundsOutboundWork(t *testing.T) {
	r := newNameRig(t, func(h *testHosts, c *lifecycle.Config) {
		c.IdlePause = 500 * time.Millisecond
		c.ActiveMax = 2 * time.Second
	})
	h := r.hosts
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	busy, err := r.mgr.Create(ctx, lifecycle.CreateRequest{ID: testenv.UniqueID("actmax"), Spec: lifecycle.Spec{Image: r.image, Ports: []int{8080}, Activity: lifecycle.ActivityAny}})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	accepted := h.accepted.Load()
	held := make(chan string, 1)
	go func() {
		c := &http.Client{Timeout: 40 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://%s/dial?addr=%s&hold=30s", busy.Upstreams[8080], url.QueryEscape(fmt.Sprintf("long.test:%d", h.port))))
		if err != nil {
			held <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		held <- string(b)
	}()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return h.accepted.Load() >= accepted+1, "the held connection never reached the host"
	})
	// Its outbound work counts while its last request is less than
	// active_max ago: past idle_pause (500ms) it still runs.
	for time.Since(created) < 1200*time.Millisecond {
		if _, err := r.mgr.ReapOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if rec, err := r.mgr.Get(busy.ID); err != nil || rec.State != lifecycle.Running {
			t.Fatalf("%s after its create, holding an outbound connection: %v %v, want running (active_max 2s)", time.Since(created).Round(time.Millisecond), rec.State, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A bound, not a goal: paused once 2s have passed since the create,
	// long before the 30s hold ends.
	testenv.Eventually(t, 15*time.Second, func() (bool, string) {
		if _, err := r.mgr.ReapOnce(ctx); err != nil {
			t.Fatal(err)
		}
		rec, err := r.mgr.Get(busy.ID)
		if err != nil {
			t.Fatal(err)
		}
		return rec.State != lifecycle.Running, "the sandbox holding an outbound connection is still running (active_max 2s)"
	})
	select {
	case body := <-held:
		t.Fatalf("the held connection ended before the pause: %s", body)
	default:
	}
}

// TestAGroupIsOneSandboxToTheFirewall: a sandbox with a service keeps one
// address, bound to the port of the container that owns the group's
// namespace (the gateway reaches the app there), one policy for every
// member (the app and its service alike reach only what it allows), and
// the members reach each other on localhost.
func TestAGroupIsOneSandboxToTheFirewall(t *testing.T) {
	r := newNameRig(t, nil)
	h := r.hosts
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := r.mgr.Create(ctx, lifecycle.CreateRequest{ID: testenv.UniqueID("grp"), Spec: lifecycle.Spec{
		Image: r.image, Ports: []int{8080}, Egress: lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"allowed.test"}},
		Services: map[string]lifecycle.Service{"db": {Image: r.image, Ready: "tcp:5432", Env: map[string]string{"PORT": "5432", "LISTEN_HOST": "127.0.0.1"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.net.Subnet.Contains(rec.Address) {
		t.Fatalf("group address %s", rec.Address)
	}
	if code, body := r.get(rec, "/fetch", url.Values{"url": {"http://127.0.0.1:5432/healthz"}}); code != 200 {
		t.Errorf("the app reaching its service on localhost: %d %s", code, body)
	}
	r.mustReach(rec, fmt.Sprintf("allowed.test:%d", h.port), "tcp")
	r.mustNotReach(rec, hp(h.internet2, h.port), "tcp")
	// The bridge binding holds the infra container's port and MAC: the
	// sandbox's address answers from nowhere else.
	bound, err := r.mgr.Runtime().(interface {
		Inspect(context.Context, string) (lifecycle.Container, error)
	}).Inspect(ctx, rec.ID)
	if err != nil || bound.Pid == 0 || bound.MAC == "" {
		t.Fatalf("the group's owner: pid %d mac %q %v", bound.Pid, bound.MAC, err)
	}
	if out := nft(t, "list", "table", "bridge", egress.TableName(r.net.Bridge)); !strings.Contains(out, strings.ToLower(bound.MAC)) {
		t.Errorf("the binding does not hold the group owner's MAC %s:\n%s", bound.MAC, out)
	}
}

// TestAClaimedSandboxResolvesThroughTheForwarder: a sandbox claimed from
// a pool is recorded as made with the forwarder, so its stop and wake
// start the same container (a container made before the forwarder would
// be made again) and its lookups go through the forwarder.
func TestAClaimedSandboxResolvesThroughTheForwarder(t *testing.T) {
	var image string
	r := newNameRig(t, func(h *testHosts, c *lifecycle.Config) {
		image = testenv.TestAppImage(t)
		tmpl := lifecycle.Template{Name: "web", Spec: lifecycle.Spec{Image: image, Ports: []int{8080},
			Egress: lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{"allowed.test"}}}, Pool: lifecycle.PoolConfig{MinIdle: 1}}
		if err := lifecycle.NormalizeTemplate(&tmpl); err != nil {
			t.Fatal(err)
		}
		c.Templates, c.PoolInterval = []lifecycle.Template{tmpl}, 100*time.Millisecond
	})
	if err := r.mgr.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		ts := r.mgr.Templates()
		return len(ts) == 1 && ts[0].Idle == 1, fmt.Sprintf("%+v", ts)
	})
	ctx := context.Background()
	rec, out, err := r.mgr.CreatePooled(ctx, lifecycle.CreateRequest{Template: "web"})
	if err != nil || !out.Hit {
		t.Fatalf("claim: %+v %v", out, err)
	}
	if !rec.DNSForwarded {
		t.Errorf("a claimed sandbox is recorded as made without the forwarder")
	}
	r.mustReach(rec, fmt.Sprintf("allowed.test:%d", r.hosts.port), "tcp")
	if _, err := r.mgr.Stop(ctx, rec.ID, "test"); err != nil {
		t.Fatal(err)
	}
	woken, err := r.mgr.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if woken.ContainerID != rec.ContainerID || woken.Reason != "wake" {
		t.Errorf("the wake of a claimed sandbox made its container again (%s → %s, %s)", rec.ContainerID, woken.ContainerID, woken.Reason)
	}
}
