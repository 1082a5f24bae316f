package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// This file holds a sandbox's egress policy (what its code may connect to)
// and the Firewall the Manager asks to enforce it. The policy is checked
// here; the firewall (package egress) only installs what it is given.

// Egress policies.
const (
	// EgressPublic lets a sandbox reach the internet but not the host,
	// private networks, link-local (cloud metadata), loopback, multicast
	// or reserved ranges.
	EgressPublic = "public"
	// EgressNone lets a sandbox open no outbound connection, DNS included.
	// Preview traffic into it and its answers still flow.
	EgressNone = "none"
)

// Egress is a sandbox's outbound network policy.
type Egress struct {
	// Policy is EgressPublic or EgressNone.
	Policy string `json:"policy"`
	// Allow entries open exactly what they list on top of the policy, each
	// "addr[/bits][:port][/tcp|/udp]" (tcp by default), in canonical form.
	Allow []string `json:"allow,omitempty"`
}

// EgressDeniedRanges are what a public policy never reaches, whatever the
// operator adds: private (RFC 1918), shared address space (CGNAT),
// link-local (cloud metadata at 169.254.169.254 included), loopback, "this
// network", multicast and reserved.
var EgressDeniedRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// AllowRule is one parsed allow entry: a destination prefix, a port (0:
// every port) and a protocol.
type AllowRule struct {
	Prefix netip.Prefix
	Port   uint16
	// Proto is "tcp" or "udp".
	Proto string
}

// MaxAllowRules bounds a sandbox's allow list.
const MaxAllowRules = 64

// ParseAllowRule parses "addr[/bits][:port][/tcp|/udp]": an IPv4 address or
// CIDR, optionally a port, optionally a protocol (tcp by default).
func ParseAllowRule(s string) (AllowRule, error) {
	orig := s
	r := AllowRule{Proto: "tcp"}
	if rest, ok := strings.CutSuffix(s, "/udp"); ok {
		r.Proto, s = "udp", rest
	} else if rest, ok := strings.CutSuffix(s, "/tcp"); ok {
		s = rest
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || p == 0 {
			return AllowRule{}, fmt.Errorf("%q: %q is not a port (1-65535)", orig, s[i+1:])
		}
		r.Port, s = uint16(p), s[:i]
	}
	var err error
	if strings.Contains(s, "/") {
		r.Prefix, err = netip.ParsePrefix(s)
		if err == nil && r.Prefix != r.Prefix.Masked() {
			return AllowRule{}, fmt.Errorf("%q: %s has host bits set (did you mean %s?)", orig, s, r.Prefix.Masked())
		}
	} else {
		var a netip.Addr
		a, err = netip.ParseAddr(s)
		if err == nil {
			r.Prefix = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil {
		return AllowRule{}, fmt.Errorf("%q: want an IPv4 address or CIDR, optionally :port and /tcp or /udp (like 198.51.100.7:443 or 203.0.113.0/24 or 198.51.100.9:53/udp)", orig)
	}
	if !r.Prefix.Addr().Is4() {
		return AllowRule{}, fmt.Errorf("%q: only IPv4 destinations (sandbox networks have no IPv6)", orig)
	}
	return r, nil
}

// String is the rule's canonical form.
func (r AllowRule) String() string {
	var b strings.Builder
	if r.Prefix.IsSingleIP() {
		b.WriteString(r.Prefix.Addr().String())
	} else {
		b.WriteString(r.Prefix.String())
	}
	if r.Port != 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(int(r.Port)))
	}
	b.WriteByte('/')
	b.WriteString(r.Proto)
	return b.String()
}

// covers reports whether r opens everything o opens.
func (r AllowRule) covers(o AllowRule) bool {
	return r.Proto == o.Proto && (r.Port == 0 || r.Port == o.Port) &&
		r.Prefix.Bits() <= o.Prefix.Bits() && r.Prefix.Contains(o.Prefix.Addr())
}

// Rules parses the allow list of e (already checked by NormalizeEgress).
func (e Egress) Rules() []AllowRule {
	out := make([]AllowRule, 0, len(e.Allow))
	for _, s := range e.Allow {
		if r, err := ParseAllowRule(s); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// EgressConfig is the operator's egress settings.
type EgressConfig struct {
	// Default is the policy of a sandbox that names none. Default: public.
	Default string
	// Deny are ranges a public policy denies beyond EgressDeniedRanges and
	// the host's own addresses.
	Deny []netip.Prefix
	// AllowPrivate are the denied destinations an allow entry may open
	// (an internal package mirror, say): an entry inside a denied range
	// is refused unless one of these covers it.
	AllowPrivate []AllowRule
	// Unenforced runs sandboxes without a firewall: policies are stored
	// and shown but nothing enforces them. The operator's explicit choice.
	Unenforced bool
}

// NormalizeEgress checks e against the operator's settings and the ranges
// denied (EgressDeniedRanges, cfg.Deny and extra, the host's addresses),
// fills the default policy and puts allow entries in canonical form. The
// error wraps ErrInvalid and names the offending entry.
func NormalizeEgress(e *Egress, cfg EgressConfig, extra []netip.Prefix) error {
	switch e.Policy {
	case "":
		e.Policy = cfg.Default
		if e.Policy == "" {
			e.Policy = EgressPublic
		}
	case EgressPublic, EgressNone:
	default:
		return invalid("egress.policy: %q is not public or none", e.Policy)
	}
	if len(e.Allow) > MaxAllowRules {
		return invalid("egress.allow: %d entries, at most %d", len(e.Allow), MaxAllowRules)
	}
	denied := slices.Concat(EgressDeniedRanges, cfg.Deny, extra)
	out := make([]string, 0, len(e.Allow))
	for _, s := range e.Allow {
		r, err := ParseAllowRule(strings.TrimSpace(s))
		if err != nil {
			return invalid("egress.allow: %v", err)
		}
		for _, d := range denied {
			if !d.Overlaps(r.Prefix) {
				continue
			}
			if !slices.ContainsFunc(cfg.AllowPrivate, func(a AllowRule) bool { return a.covers(r) }) {
				return invalid("egress.allow: %q is inside the denied range %s; the operator can open it with egress_allow_private", s, d)
			}
			break
		}
		if c := r.String(); !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	e.Allow = out
	if len(e.Allow) == 0 {
		e.Allow = nil
	}
	return nil
}

// ErrEgressUnenforced: the gateway cannot install the egress firewall (no
// CAP_NET_ADMIN in the engine host's network namespace, a remote engine,
// no sandbox network of its own), so sandboxes are not started.
var ErrEgressUnenforced = errors.New("egress policy cannot be enforced")

// SandboxNet describes the network sandboxes join, as the firewall needs it.
type SandboxNet struct {
	// Name is the Docker network's name; Bridge its bridge interface.
	Name   string
	Bridge string
	// Subnet and Gateway are the network's; First..Last is the range of
	// addresses sandwake hands to sandboxes (the engine allocates only
	// outside it).
	Subnet  netip.Prefix
	Gateway netip.Addr
	First   netip.Addr
	Last    netip.Addr
}

// NetworkRuntime is implemented by runtimes that put sandboxes on a
// network of their own with addresses the Manager chooses (Spec.Address):
// only then can a firewall key a sandbox's rules by its address.
type NetworkRuntime interface {
	// SandboxNetwork makes sure the sandbox network exists and describes it.
	SandboxNetwork(ctx context.Context) (SandboxNet, error)
}

// FirewallEntry is what the firewall installs for one sandbox.
type FirewallEntry struct {
	ID      string
	Address netip.Addr
	Egress  Egress
}

// FirewallStatus is what the firewall reports of itself.
type FirewallStatus struct {
	// Repaired is true when Sync found the table missing or changed and
	// installed it again.
	Repaired bool
	// Added and Removed count the sandbox entries Sync put back and took
	// away (sandboxes gone).
	Added, Removed int
	// Rebound counts the running sandboxes whose port binding the
	// Manager's sync had to make again.
	Rebound int
}

// Firewall enforces sandboxes' egress policies in the kernel. Entries are
// keyed by address: Apply for an address replaces whatever was there in
// one atomic step, so an address handed to a new sandbox never carries
// the old one's rules.
type Firewall interface {
	// Setup installs the firewall's table for the sandbox network (again,
	// when it was removed). It wraps ErrEgressUnenforced when the rules
	// cannot be installed here.
	Setup(ctx context.Context, net SandboxNet) error
	// Apply installs or replaces one sandbox's rules.
	Apply(e FirewallEntry) error
	// Remove takes one sandbox's rules away; a missing entry is not an
	// error.
	Remove(id string, addr netip.Addr) error
	// Sync makes the installed entries exactly entries, re-creating the
	// table when it is missing.
	Sync(entries []FirewallEntry) (FirewallStatus, error)
	// Denied reports the packets each sandbox's policy refused, by id.
	Denied() (map[string]uint64, error)
	// DeniedRanges is the full list a public policy denies (the fixed
	// ranges, the operator's and the host's own addresses).
	DeniedRanges() []netip.Prefix
	// Bind lets only the container's own bridge port and MAC speak with
	// its address on the sandbox bridge (IPv4 and ARP): until an address
	// is bound, every frame claiming it is dropped, and a frame from a
	// bound port must carry that port's MAC and address. Docker makes a
	// new port at every start, so every start binds again.
	Bind(b PortBinding) error
	// Unbind removes an address's binding (its container stopped or is
	// gone); a missing binding is not an error.
	Unbind(addr netip.Addr) error
	// Bound reports the bound addresses whose port is still on the
	// bridge: an address missing here needs binding again.
	Bound() (map[netip.Addr]bool, error)
}

// PortBinding ties a sandbox's address to its running container: the
// bridge port leading into the container's network namespace (found from
// one of its processes) and the MAC of its interface there.
type PortBinding struct {
	ID      string
	Address netip.Addr
	// Pid is a process of the container.
	Pid int
	// MAC is the container's interface's, as the engine set it.
	MAC string
}
