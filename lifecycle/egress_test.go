package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
)

func TestParseAllowRule(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"198.51.100.7:443", "198.51.100.7:443/tcp", ""},
		{"203.0.113.0/24", "203.0.113.0/24/tcp", ""},
		{"198.51.100.9:53/udp", "198.51.100.9:53/udp", ""},
		{"203.0.113.0/24:8443/tcp", "203.0.113.0/24:8443/tcp", ""},
		{"198.51.100.7/udp", "198.51.100.7/udp", ""},
		{"203.0.113.1/24", "", "host bits"},
		{"198.51.100.7:0", "", "not a port"},
		{"198.51.100.7:70000", "", "not a port"},
		{"Example.COM.:443", "example.com:443", ""},
		{"registry.npmjs.org", "registry.npmjs.org", ""},
		{"*.githubusercontent.com", "*.githubusercontent.com", ""},
		{"api.example.com:443/udp", "api.example.com:443/udp", ""},
		{"a.*.example.com", "", "not a DNS name"},
		{"localhost", "", "not a DNS name"},
		{"-bad.example.com", "", "not a DNS name"},
		{"ex ample.com", "", "not a DNS name"},
		{"example.123", "", "not a DNS name"},
		{"exa\\.mple.com", "", "not a DNS name"},
		{"[2001:db8::1]:443", "", ""}, // parsed below
		{"", "", "DNS name or an IPv4 address"},
	} {
		r, err := lifecycle.ParseAllowRule(tc.in)
		if tc.in == "[2001:db8::1]:443" {
			if err == nil {
				t.Errorf("%q: IPv6 accepted", tc.in)
			}
			continue
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || r.String() != tc.want {
			t.Errorf("%q: %v %v, want %s", tc.in, r, err, tc.want)
		}
	}
}

func TestNormalizeEgress(t *testing.T) {
	private := lifecycle.AllowRule{Prefix: netip.MustParsePrefix("10.0.5.0/24"), Port: 3142, Proto: "tcp"}
	cfg := lifecycle.EgressConfig{Default: lifecycle.EgressNone, Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}, AllowPrivate: []lifecycle.AllowRule{private}}
	for _, tc := range []struct {
		in        lifecycle.Egress
		want, err string
	}{
		{lifecycle.Egress{}, "none", ""},
		{lifecycle.Egress{Policy: "public", Allow: []string{"198.51.100.7:443", "198.51.100.7:443/tcp"}}, "public 198.51.100.7:443/tcp", ""},
		{lifecycle.Egress{Policy: "open"}, "", "not public, none or learn"},
		{lifecycle.Egress{Policy: "learn"}, "learn", ""},
		{lifecycle.Egress{Allow: []string{"Registry.NPMjs.org", "registry.npmjs.org."}}, "none registry.npmjs.org", ""},
		{lifecycle.Egress{Allow: []string{"not_a name"}}, "", "not_a name"},
		{lifecycle.Egress{Allow: []string{"dns.example.com:53/udp"}}, "", "opens a DNS port"},
		{lifecycle.Egress{Allow: []string{"198.51.100.9:853"}}, "", "opens a DNS port"},
		{lifecycle.Egress{Policy: "none", Deny: []string{"pastebin.com"}}, "", "deny entries apply under public and learn"},
		{lifecycle.Egress{Allow: []string{"10.0.5.20:3142"}}, "none 10.0.5.20:3142/tcp", ""},
		{lifecycle.Egress{Allow: []string{"10.0.5.20:22"}}, "", "egress_allow_private"},
		{lifecycle.Egress{Allow: []string{"10.0.5.20:3142/udp"}}, "", "egress_allow_private"},
		{lifecycle.Egress{Allow: []string{"10.0.0.0/8:3142"}}, "", "egress_allow_private"},
		{lifecycle.Egress{Allow: []string{"169.254.169.254:80"}}, "", "169.254.0.0/16"},
		{lifecycle.Egress{Allow: []string{"0.0.0.0/0"}}, "", "denied range"},
		{lifecycle.Egress{Allow: []string{"203.0.113.9:443"}}, "", "203.0.113.0/24"},
		{lifecycle.Egress{Allow: []string{"192.0.2.2:443"}}, "", "192.0.2.2/32"}, // a host address (extra)
	} {
		e := tc.in
		err := lifecycle.NormalizeEgress(&e, cfg, []netip.Prefix{netip.MustParsePrefix("192.0.2.2/32")})
		if tc.err != "" {
			if !errors.Is(err, lifecycle.ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%+v: err %v, want invalid naming %q", tc.in, err, tc.err)
			}
			continue
		}
		if got := strings.TrimSpace(e.Policy + " " + strings.Join(e.Allow, " ")); err != nil || got != tc.want {
			t.Errorf("%+v: %q %v, want %q", tc.in, got, err, tc.want)
		}
	}
}

// netRuntime gives the fake runtime a sandbox network.
type netRuntime struct{ *lifecycletest.Runtime }

func (netRuntime) SandboxNetwork(context.Context) (lifecycle.SandboxNet, error) {
	return lifecycle.SandboxNet{Name: "n", Bridge: "br", Subnet: netip.MustParsePrefix("10.9.0.0/24"),
		Gateway: netip.MustParseAddr("10.9.0.1"), First: netip.MustParseAddr("10.9.0.2"), Last: netip.MustParseAddr("10.9.0.4")}, nil
}

// fakeFirewall holds entries in memory; Sync can be held at its start.
type fakeFirewall struct {
	mu      sync.Mutex
	entries map[netip.Addr]lifecycle.FirewallEntry
	hold    chan struct{} // when set, Sync waits on it after entering
	entered chan struct{}
}

func (f *fakeFirewall) Setup(context.Context, lifecycle.SandboxNet) error { return nil }
func (f *fakeFirewall) Apply(e lifecycle.FirewallEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries[e.Address] = e
	return nil
}
func (f *fakeFirewall) Remove(id string, a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.entries[a].ID == id {
		delete(f.entries, a)
	}
	return nil
}
func (f *fakeFirewall) Sync(es []lifecycle.FirewallEntry) (lifecycle.FirewallStatus, error) {
	if f.hold != nil {
		f.entered <- struct{}{}
		<-f.hold
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries = map[netip.Addr]lifecycle.FirewallEntry{}
	for _, e := range es {
		f.entries[e.Address] = e
	}
	return lifecycle.FirewallStatus{}, nil
}
func (f *fakeFirewall) Denied() (map[string]uint64, error)  { return map[string]uint64{}, nil }
func (f *fakeFirewall) DeniedRanges() []netip.Prefix        { return nil }
func (f *fakeFirewall) Bind(lifecycle.PortBinding) error    { return nil }
func (f *fakeFirewall) Unbind(netip.Addr) error             { return nil }
func (f *fakeFirewall) Bound() (map[netip.Addr]bool, error) { return nil, nil }

func (f *fakeFirewall) ids() map[netip.Addr]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[netip.Addr]string{}
	for a, e := range f.entries {
		out[a] = e.ID
	}
	return out
}

// TestFirewallSyncRacesCreateAndDestroy: a create and a destroy that land
// while a firewall sync is under way neither lose the new entry nor bring
// back the destroyed one over its address's new holder.
func TestFirewallSyncRacesCreateAndDestroy(t *testing.T) {
	fw := &fakeFirewall{entries: map[netip.Addr]lifecycle.FirewallEntry{}}
	env := newTestEnvWith(t, lifecycle.Config{Firewall: fw}, func(rt *lifecycletest.Runtime) lifecycle.Runtime { return netRuntime{rt} })
	ctx := context.Background()
	old, err := env.m.Create(ctx, lifecycle.CreateRequest{ID: "old", Spec: testSpec()})
	if err != nil {
		t.Fatal(err)
	}
	fw.hold, fw.entered = make(chan struct{}), make(chan struct{})
	synced := make(chan error, 1)
	go func() {
		_, err := env.m.SyncFirewall(ctx)
		synced <- err
	}()
	<-fw.entered // the sync has read the records (old only) and is installing them
	done := make(chan struct{})
	var created lifecycle.Record
	go func() {
		defer close(done)
		if err := env.m.Destroy(ctx, "old", "test"); err != nil {
			t.Error(err)
		}
		if created, err = env.m.Create(ctx, lifecycle.CreateRequest{ID: "new", Spec: testSpec()}); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
		t.Fatal("the destroy and create did not wait for the sync under way")
	case <-time.After(50 * time.Millisecond):
		// Not a timing assertion: had they not waited, done would be
		// closed; either way the end state below is what is checked.
	}
	close(fw.hold)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	<-done
	if created.Address != old.Address {
		t.Fatalf("the new sandbox got %s, not the destroyed one's %s: the reuse under test did not happen", created.Address, old.Address)
	}
	if got, want := fw.ids(), map[netip.Addr]string{old.Address: "new"}; !maps.Equal(got, want) {
		t.Errorf("firewall entries %v, want %v", got, want)
	}
}

func TestNormalizeEgressDeny(t *testing.T) {
	e := lifecycle.Egress{Policy: "public", Deny: []string{"Pastebin.com", "203.0.113.0/24", "198.51.100.7:22/tcp"}}
	if err := lifecycle.NormalizeEgress(&e, lifecycle.EgressConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	if want := []string{"pastebin.com", "203.0.113.0/24", "198.51.100.7:22/tcp"}; !slices.Equal(e.Deny, want) {
		t.Errorf("deny %v, want %v", e.Deny, want)
	}
	rules := e.DenyRules()
	if rules[1].Proto != "" || rules[2].Proto != "tcp" || !rules[0].IsName() {
		t.Errorf("deny rules %+v: a bare address denies every protocol", rules)
	}
	bad := lifecycle.Egress{Policy: "public", Deny: []string{"pastebin..com"}}
	if err := lifecycle.NormalizeEgress(&bad, lifecycle.EgressConfig{}, nil); !errors.Is(err, lifecycle.ErrInvalid) || !strings.Contains(err.Error(), "pastebin..com") {
		t.Errorf("a bad deny name: %v", err)
	}
}

func TestLearned(t *testing.T) {
	a, b := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	l := lifecycle.EgressLog{
		Lookups: []lifecycle.EgressLookup{
			{Name: "b.example.com", Addrs: []netip.Addr{b}, Allowed: true},
			{Name: "a.example.com", Addrs: []netip.Addr{a}, Allowed: true},
			{Name: "nx.example.com"},
			// Under learn a deny entry refused it: a lock must not open it.
			{Name: "pastebin.com", Addrs: []netip.Addr{netip.MustParseAddr("198.51.100.3")}},
		},
		Decisions: []lifecycle.EgressDecision{
			{Addr: a, Port: 443, Proto: "tcp", Allowed: true, Name: "a.example.com"},
			{Addr: netip.MustParseAddr("203.0.113.9"), Port: 5432, Proto: "tcp", Allowed: true},
			{Addr: netip.MustParseAddr("203.0.113.10"), Port: 22, Proto: "tcp"},
			{Addr: netip.MustParseAddr("198.51.100.3"), Port: 443, Proto: "tcp", Name: "pastebin.com"},
		},
	}
	want := []string{"a.example.com", "b.example.com", "203.0.113.9:5432/tcp"}
	if got := lifecycle.Learned(l); !slices.Equal(got, want) {
		t.Errorf("learned %v, want %v", got, want)
	}
}

// TestDefaultAllowOnlyAtCreate: egress_allow fills the allow list of a
// create that gives none, and nothing else: a create with its own list,
// and a PATCH that empties it, keep theirs.
func TestDefaultAllowOnlyAtCreate(t *testing.T) {
	fw := &fakeFirewall{entries: map[netip.Addr]lifecycle.FirewallEntry{}}
	cfg := lifecycle.Config{Firewall: fw, Egress: lifecycle.EgressConfig{Default: lifecycle.EgressNone, DefaultAllow: []string{"registry.npmjs.org"}}}
	env := newTestEnvWith(t, cfg, func(rt *lifecycletest.Runtime) lifecycle.Runtime { return netRuntime{rt} })
	ctx := context.Background()
	plain, err := env.m.Create(ctx, lifecycle.CreateRequest{ID: "plain", Spec: testSpec()})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(plain.Spec.Egress.Allow, []string{"registry.npmjs.org"}) {
		t.Errorf("a create without a list got %v", plain.Spec.Egress.Allow)
	}
	if got := fw.entries[plain.Address].Egress.Allow; !slices.Equal(got, []string{"registry.npmjs.org"}) {
		t.Errorf("the firewall was given %v", got)
	}
	spec := testSpec()
	spec.Egress = lifecycle.Egress{Allow: []string{"pypi.org"}}
	own, err := env.m.Create(ctx, lifecycle.CreateRequest{ID: "own", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(own.Spec.Egress.Allow, []string{"pypi.org"}) {
		t.Errorf("a create with its own list got %v", own.Spec.Egress.Allow)
	}
	patched, err := env.m.Update("plain", lifecycle.Patch{Egress: &lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(patched.Spec.Egress.Allow) != 0 {
		t.Errorf("a PATCH emptying the list got %v", patched.Spec.Egress.Allow)
	}
}

// learningFirewall is a fakeFirewall that observes: its logs are set by
// the test, and TakeLearning hands out those marked grown.
type learningFirewall struct {
	*fakeFirewall
	mu   sync.Mutex
	logs map[string]lifecycle.EgressLog
	grew map[string]bool
}

func (f *learningFirewall) set(id string, l lifecycle.EgressLog) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logs[id], f.grew[id] = l, true
}

func (f *learningFirewall) EgressLog(id string) lifecycle.EgressLog {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.logs[id]
}
func (f *learningFirewall) OnDenied(func(lifecycle.Event) bool) {}
func (f *learningFirewall) ForgetDenials(string)                {}
func (f *learningFirewall) Outbound(netip.Addr) time.Time       { return time.Time{} }
func (f *learningFirewall) TakeLearning() map[string]lifecycle.EgressLog {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]lifecycle.EgressLog{}
	for id := range f.grew {
		out[id] = f.logs[id]
	}
	clear(f.grew)
	return out
}

func lookupLog(names ...string) lifecycle.EgressLog {
	var l lifecycle.EgressLog
	for i, n := range names {
		l.Lookups = append(l.Lookups, lifecycle.EgressLookup{Name: n, Addrs: []netip.Addr{netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)})}, Allowed: true})
	}
	return l
}

// TestLearnedSurvivesARestart: what a sandbox under learn used is kept in
// its record by the activity flush, so a lock after the in-memory log was
// lost (a gateway restart) still allows it, with what the log shows since;
// a PATCH out of learn forgets it.
func TestLearnedSurvivesARestart(t *testing.T) {
	fw := &learningFirewall{fakeFirewall: &fakeFirewall{entries: map[netip.Addr]lifecycle.FirewallEntry{}}, logs: map[string]lifecycle.EgressLog{}, grew: map[string]bool{}}
	env := newTestEnvWith(t, lifecycle.Config{Firewall: fw}, func(rt *lifecycletest.Runtime) lifecycle.Runtime { return netRuntime{rt} })
	ctx := context.Background()
	spec := testSpec()
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressLearn}
	if _, err := env.m.Create(ctx, lifecycle.CreateRequest{ID: "learner", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	fw.set("learner", lookupLog("registry.npmjs.org", "api.example.com"))
	if err := env.m.FlushActivity(); err != nil {
		t.Fatal(err)
	}
	rec, _ := env.m.Get("learner")
	if want := []string{"api.example.com", "registry.npmjs.org"}; !slices.Equal(rec.EgressLearned, want) {
		t.Fatalf("kept %v, want %v", rec.EgressLearned, want)
	}
	// The restart: the log starts over and sees one more name.
	fw.set("learner", lookupLog("pypi.org"))
	locked, err := env.m.LockEgress("learner")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"api.example.com", "pypi.org", "registry.npmjs.org"}; locked.Spec.Egress.Policy != lifecycle.EgressNone || !slices.Equal(locked.Spec.Egress.Allow, want) {
		t.Fatalf("locked to %s %v, want none %v", locked.Spec.Egress.Policy, locked.Spec.Egress.Allow, want)
	}
	if locked.EgressLearned != nil {
		t.Errorf("a locked sandbox keeps its learned list %v", locked.EgressLearned)
	}
	// Under another policy, nothing is kept.
	fw.set("learner", lookupLog("late.example.com"))
	if err := env.m.FlushActivity(); err != nil {
		t.Fatal(err)
	}
	if rec, _ := env.m.Get("learner"); rec.EgressLearned != nil {
		t.Errorf("a sandbox not learning kept %v", rec.EgressLearned)
	}
}

func TestMergeLearned(t *testing.T) {
	got := lifecycle.MergeLearned(
		[]string{"b.example.com", "198.51.100.7:443/tcp"},
		[]string{"a.example.com", "b.example.com", "[2001:db8::1]:53/udp", "198.51.100.7:443/tcp"})
	want := []string{"a.example.com", "b.example.com", "198.51.100.7:443/tcp", "[2001:db8::1]:53/udp"}
	if !slices.Equal(got, want) {
		t.Errorf("merged %v, want %v", got, want)
	}
	var many []string
	for i := range 1000 {
		many = append(many, fmt.Sprintf("n%04d.example.com", i))
	}
	if n := len(lifecycle.MergeLearned(nil, many)); n != 4*lifecycle.MaxAllowRules {
		t.Errorf("merged %d entries, want the bound %d", n, 4*lifecycle.MaxAllowRules)
	}
}
