package egress

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sandwake/sandwake/lifecycle"
)

func TestMatchName(t *testing.T) {
	for _, tc := range []struct {
		rule, name string
		want       bool
	}{
		{"registry.npmjs.org", "registry.npmjs.org", true},
		{"registry.npmjs.org", "x.registry.npmjs.org", false},
		{"*.githubusercontent.com", "raw.githubusercontent.com", true},
		{"*.githubusercontent.com", "a.b.githubusercontent.com", true},
		{"*.githubusercontent.com", "githubusercontent.com", false},
		{"*.githubusercontent.com", "evilgithubusercontent.com", false},
	} {
		r, err := lifecycle.ParseAllowRule(tc.rule)
		if err != nil {
			t.Fatal(err)
		}
		if got := matchName(r, tc.name); got != tc.want {
			t.Errorf("%s matches %s: %v, want %v", tc.rule, tc.name, got, tc.want)
		}
	}
}

func TestPrivateOpened(t *testing.T) {
	mirror := netip.MustParseAddr("10.0.5.20")
	tcpOnly := []lifecycle.AllowRule{{Prefix: netip.MustParsePrefix("10.0.5.0/24"), Proto: "tcp"}}
	both := append(slices.Clone(tcpOnly), lifecycle.AllowRule{Prefix: netip.MustParsePrefix("10.0.5.0/24"), Proto: "udp"})
	bare, _ := lifecycle.ParseAllowRule("mirror.internal.example")
	tcp443, _ := lifecycle.ParseAllowRule("mirror.internal.example:443/tcp")
	if privateOpened(tcpOnly, mirror, bare) {
		t.Errorf("a tcp-only allowance opened a bare name (tcp and udp)")
	}
	if !privateOpened(tcpOnly, mirror, tcp443) || !privateOpened(both, mirror, bare) {
		t.Errorf("an allowance covering the rule did not open it")
	}
	if privateOpened(both, netip.MustParseAddr("10.0.6.1"), bare) {
		t.Errorf("an address outside the allowance opened")
	}
}
