package docker

import (
	"net/netip"
	"strings"
	"testing"
)

// TestChooseUpstream: the automatic upstream mode is direct only for a
// local engine whose sandbox bridge is in the gateway's namespace, and the
// reason says why either way (the start-up log and readyz show it).
func TestChooseUpstream(t *testing.T) {
	local := []netip.Addr{netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("127.0.0.1")}
	for _, c := range []struct {
		host       string
		bridgeHere bool
		want, why  string
	}{
		{"", true, UpstreamDirect, "is on this host"},
		{"unix:///var/run/docker.sock", true, UpstreamDirect, "is on this host"},
		{"tcp://127.0.0.1:2375", true, UpstreamDirect, "is on this host"},
		{"tcp://10.0.0.11:2376", true, UpstreamDirect, "is on this host"},
		{"tcp://localhost:2375", true, UpstreamDirect, "is on this host"},
		// A remote engine: its bridge is not here, whatever an interface of
		// the same name says.
		{"tcp://10.0.0.99:2376", false, UpstreamPublished, "not on this host"},
		{"tcp://10.0.0.99:2376", true, UpstreamPublished, "not on this host"},
		{"ssh://build@docker.example", true, UpstreamPublished, "not on this host"},
		// A local socket whose bridge is elsewhere (Docker Desktop's VM, a
		// gateway in a container without the host's network).
		{"unix:///var/run/docker.sock", false, UpstreamPublished, "not in this gateway's network namespace"},
	} {
		mode, why := chooseUpstream(c.host, local, "sw-abc", c.bridgeHere)
		if mode != c.want || !strings.Contains(why, c.why) {
			t.Errorf("host %q, bridge here %v: %s (%s), want %s (…%s…)", c.host, c.bridgeHere, mode, why, c.want, c.why)
		}
	}
}
