package lifecycle_test

import (
	"context"
	"errors"
	"maps"
	"net/netip"
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
		{"example.com:443", "", "IPv4 address or CIDR"},
		{"[2001:db8::1]:443", "", ""}, // parsed below
		{"", "", "IPv4 address or CIDR"},
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
		{lifecycle.Egress{Policy: "open"}, "", "not public or none"},
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
