package egress_test

import (
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// manyHosts routes 198.19.0.0/16 to the test hosts' namespace, where every
// address of it is local (the echo listeners answer on all of them), so
// that each of thousands of names can resolve to an address no set has
// held before. Removed with the namespace and the veth.
func manyHosts(t testing.TB, h *testHosts) netip.Prefix {
	t.Helper()
	p := netip.MustParsePrefix("198.19.0.0/16")
	run(t, "ip", "route", "add", p.String(), "via", h.private.String())
	run(t, "ip", "netns", "exec", h.ns, "ip", "route", "add", "local", p.String(), "dev", "lo")
	return p
}

// firstConnects has the sandbox look up n names, each answered with an
// address of its own, and connect to each right after its lookup; it
// returns the connects refused and the lookups failed.
func firstConnects(t testing.TB, r *nameRig, n int) (refused, failed int, detail string) {
	a := r.create(testenv.UniqueID("first"), lifecycle.Egress{Policy: lifecycle.EgressNone, Allow: []string{fmt.Sprintf("*.many.test:%d/tcp", r.hosts.port)}})
	code, body := r.get(a, "/dials", url.Values{"addr": {fmt.Sprintf("h{i}.many.test:%d", r.hosts.port)}, "n": {strconv.Itoa(n)}})
	f := strings.Fields(body)
	if code != 200 || len(f) < 6 {
		t.Fatalf("/dials: %d %s", code, body)
	}
	refused, _ = strconv.Atoi(f[3])
	failed, _ = strconv.Atoi(f[5])
	return refused, failed, body
}

func newManyRig(t testing.TB) *nameRig {
	r := newNameRig(t, nil)
	p := manyHosts(t, r.hosts)
	base := p.Addr().As4()
	r.dns.mu.Lock() // ServeDNS reads it under the lock, in the server's goroutines
	defer r.dns.mu.Unlock()
	r.dns.dynamic = func(name string) (record, bool) {
		var i int
		if _, err := fmt.Sscanf(name, "h%d.many.test.", &i); err != nil || i < 0 || i >= 65000 {
			return record{}, false
		}
		v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(i+1)
		return record{addr: netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), ttl: 1}, true
	}
	return r
}

// TestFirstConnectAfterALookupIsNeverRefused: the forwarder writes an
// answer's addresses into the sandbox's set before it answers, so the
// connect that follows never meets a rule not yet there. Each name
// resolves to an address no set held before. SANDWAKE_FIRST_CONNECTS sets
// the count (default 2,000; the bench runs 10,000).
func TestFirstConnectAfterALookupIsNeverRefused(t *testing.T) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("SANDWAKE_FIRST_CONNECTS")); err == nil && v > 0 {
		n = v
	}
	r := newManyRig(t)
	refused, failed, body := firstConnects(t, r, n)
	t.Logf("%d lookups, each followed by a connect: %d refused, %d lookups failed", n, refused, failed)
	if refused != 0 || failed != 0 {
		t.Errorf("%d of %d first connects refused, %d lookups failed: %s", refused, n, failed, body)
	}
}
