package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
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
	// EgressNone lets a sandbox open no outbound connection but those its
	// allow list names. Its lookups of other names are answered NXDOMAIN
	// by the forwarder without asking anyone: no query leaves the host.
	// Preview traffic into it and its answers still flow.
	EgressNone = "none"
	// EgressLearn is EgressPublic that records every name looked up and
	// every address connected to, for LockEgress to turn into an allow
	// list under EgressNone.
	EgressLearn = "learn"
)

// Egress is a sandbox's outbound network policy.
type Egress struct {
	// Policy is EgressPublic, EgressNone or EgressLearn.
	Policy string `json:"policy"`
	// Allow entries open exactly what they list on top of the policy: an
	// address "addr[/bits][:port][/tcp|/udp]" (tcp by default) or a name
	// "name[:port][/tcp|/udp]" (a bare name opens every port over tcp and
	// udp; "*.name" matches its subdomains at any depth, not the name), in
	// canonical form.
	Allow []string `json:"allow,omitempty"`
	// Deny entries, under public and learn, refuse what they list although
	// the policy would let it through, in the same forms. Deny wins over
	// allow: where a denied and an allowed name share an address (a CDN),
	// the address is refused.
	Deny []string `json:"deny,omitempty"`
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

// AllowRule is one parsed allow or deny entry: a destination (an address
// prefix, or a DNS name), a port (0: every port) and a protocol.
type AllowRule struct {
	// Prefix is the destination of an address entry; invalid for a name.
	Prefix netip.Prefix
	// Name is the destination of a name entry, lower case without the
	// final dot; "*.example.com" matches every name under example.com.
	Name string
	Port uint16
	// Proto is "tcp" or "udp"; "" (names only) is both.
	Proto string
}

// IsName reports whether r is a name entry.
func (r AllowRule) IsName() bool { return r.Name != "" }

// MaxAllowRules bounds a sandbox's allow list (and its deny list).
const MaxAllowRules = 64

// DNS ports: a sandbox's lookups go through sandwake's forwarder only, so
// no entry may open them elsewhere.
const (
	portDNS = 53
	portDoT = 853
)

// ValidEgressName reports whether n (lower case, no final dot) can be a
// DNS name: labels of letters, digits, '-' and '_', 1 to 63 bytes, not
// starting or ending with '-', at least two labels, at most 253 bytes;
// "*." in front for a wildcard. A label of digits alone is allowed but the
// last one is not (an address is not a name).
func ValidEgressName(n string) bool {
	n, _ = strings.CutPrefix(n, "*.")
	if len(n) == 0 || len(n) > 253 {
		return false
	}
	labels := strings.Split(n, ".")
	if len(labels) < 2 {
		return false
	}
	for i, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		digits := true
		for j := 0; j < len(l); j++ {
			c := l[j]
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c == '-', c == '_':
				digits = false
			default:
				return false
			}
		}
		if digits && i == len(labels)-1 {
			return false
		}
	}
	return true
}

// LearnableName reports whether a name looked up may enter a learned list
// (and so a lock's allow list): a valid name with no '*' label. A lookup of
// the literal "*.example.com" (which a wildcard record answers) must not
// become a wildcard allow: a lock writes exact names only.
func LearnableName(n string) bool {
	return !strings.Contains(n, "*") && ValidEgressName(n)
}

// ParseAllowRule parses an allow or deny entry: "addr[/bits][:port][/tcp|/udp]"
// (an IPv4 address or CIDR; tcp by default) or "name[:port][/tcp|/udp]" (a DNS
// name or "*.name"; tcp and udp by default).
func ParseAllowRule(s string) (AllowRule, error) {
	orig := s
	r := AllowRule{}
	if rest, ok := strings.CutSuffix(s, "/udp"); ok {
		r.Proto, s = "udp", rest
	} else if rest, ok := strings.CutSuffix(s, "/tcp"); ok {
		r.Proto, s = "tcp", rest
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || p == 0 {
			return AllowRule{}, fmt.Errorf("%q: %q is not a port (1-65535)", orig, s[i+1:])
		}
		r.Port, s = uint16(p), s[:i]
	}
	if isNameLike(s) {
		n := strings.TrimSuffix(strings.ToLower(s), ".")
		if !ValidEgressName(n) {
			return AllowRule{}, fmt.Errorf("%q: %q is not a DNS name (labels of letters, digits, '-' and '_', like registry.npmjs.org or *.githubusercontent.com; \"*.\" only in front)", orig, s)
		}
		r.Name = n
		return r, nil
	}
	if r.Proto == "" {
		r.Proto = "tcp"
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
		return AllowRule{}, fmt.Errorf("%q: want a DNS name or an IPv4 address or CIDR, optionally :port and /tcp or /udp (like registry.npmjs.org, *.githubusercontent.com, api.example.com:443, 198.51.100.7:443 or 203.0.113.0/24)", orig)
	}
	if !r.Prefix.Addr().Is4() {
		return AllowRule{}, fmt.Errorf("%q: only IPv4 destinations (sandbox networks have no IPv6)", orig)
	}
	return r, nil
}

// isNameLike: s has a letter, '*' or '_' and no ':' or '/' (an address
// or CIDR has neither letters nor those; IPv6 has ':').
func isNameLike(s string) bool {
	if strings.ContainsAny(s, ":/[]") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20
		if (c >= 'a' && c <= 'z') || s[i] == '*' || s[i] == '_' {
			return true
		}
	}
	return false
}

// String is the rule's canonical form.
func (r AllowRule) String() string {
	var b strings.Builder
	switch {
	case r.IsName():
		b.WriteString(r.Name)
	case r.Prefix.IsSingleIP():
		b.WriteString(r.Prefix.Addr().String())
	default:
		b.WriteString(r.Prefix.String())
	}
	if r.Port != 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(int(r.Port)))
	}
	if r.Proto != "" {
		b.WriteByte('/')
		b.WriteString(r.Proto)
	}
	return b.String()
}

// covers reports whether the address rule r opens everything o opens.
func (r AllowRule) covers(o AllowRule) bool {
	return !r.IsName() && !o.IsName() && r.Proto == o.Proto && (r.Port == 0 || r.Port == o.Port) &&
		r.Prefix.Bits() <= o.Prefix.Bits() && r.Prefix.Contains(o.Prefix.Addr())
}

// Rules parses the allow list of e (already checked by NormalizeEgress).
func (e Egress) Rules() []AllowRule { return parseRules(e.Allow) }

// DenyRules parses the deny list of e (already checked by NormalizeEgress).
// A deny entry without a protocol refuses both (and ICMP, for an address).
func (e Egress) DenyRules() []AllowRule {
	out := make([]AllowRule, 0, len(e.Deny))
	for _, s := range e.Deny {
		if r, err := parseDenyRule(s); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// parseDenyRule is ParseAllowRule where no protocol means every one.
func parseDenyRule(s string) (AllowRule, error) {
	r, err := ParseAllowRule(s)
	if err == nil && !strings.HasSuffix(s, "/tcp") && !strings.HasSuffix(s, "/udp") {
		r.Proto = ""
	}
	return r, err
}

func parseRules(l []string) []AllowRule {
	out := make([]AllowRule, 0, len(l))
	for _, s := range l {
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
	// DefaultAllow is the allow list of a sandbox created without one
	// (egress_allow): applied at create only, never to a PATCH.
	DefaultAllow []string
	// Deny are ranges a public policy denies beyond EgressDeniedRanges and
	// the host's own addresses.
	Deny []netip.Prefix
	// AllowPrivate are the denied destinations an allow entry may open
	// (an internal package mirror, say): an entry inside a denied range
	// is refused unless one of these covers it, and an allowed name's
	// answer inside a denied range opens nothing unless one covers it.
	AllowPrivate []AllowRule
	// Unenforced runs sandboxes without a firewall: policies are stored
	// and shown but nothing enforces them. The operator's explicit choice.
	Unenforced bool
}

// NormalizeEgress checks e against the operator's settings and the ranges
// denied (EgressDeniedRanges, cfg.Deny and extra, the host's addresses),
// fills the default policy and puts allow and deny entries in canonical
// form. The error wraps ErrInvalid and names the offending entry.
func NormalizeEgress(e *Egress, cfg EgressConfig, extra []netip.Prefix) error {
	switch e.Policy {
	case "":
		e.Policy = cfg.Default
		if e.Policy == "" {
			e.Policy = EgressPublic
		}
	case EgressPublic, EgressNone, EgressLearn:
	default:
		return invalid("egress.policy: %q is not public, none or learn", e.Policy)
	}
	if len(e.Allow) > MaxAllowRules {
		return invalid("egress.allow: %d entries, at most %d", len(e.Allow), MaxAllowRules)
	}
	if len(e.Deny) > MaxAllowRules {
		return invalid("egress.deny: %d entries, at most %d", len(e.Deny), MaxAllowRules)
	}
	if len(e.Deny) > 0 && e.Policy == EgressNone {
		return invalid("egress.deny: a none policy opens nothing to deny; deny entries apply under public and learn")
	}
	denied := slices.Concat(EgressDeniedRanges, cfg.Deny, extra)
	out := make([]string, 0, len(e.Allow))
	for _, s := range e.Allow {
		r, err := ParseAllowRule(strings.TrimSpace(s))
		if err != nil {
			return invalid("egress.allow: %v", err)
		}
		if r.Port == portDNS || r.Port == portDoT {
			return invalid("egress.allow: %q opens a DNS port (%d): sandboxes look names up through sandwake's forwarder only, which asks the operator's egress_dns", s, r.Port)
		}
		if !r.IsName() {
			for _, d := range denied {
				if !d.Overlaps(r.Prefix) {
					continue
				}
				if !slices.ContainsFunc(cfg.AllowPrivate, func(a AllowRule) bool { return a.covers(r) }) {
					return invalid("egress.allow: %q is inside the denied range %s; the operator can open it with egress_allow_private", s, d)
				}
				break
			}
		}
		if c := r.String(); !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	dout := make([]string, 0, len(e.Deny))
	for _, s := range e.Deny {
		r, err := parseDenyRule(strings.TrimSpace(s))
		if err != nil {
			return invalid("egress.deny: %v", err)
		}
		if c := r.String(); !slices.Contains(dout, c) {
			dout = append(dout, c)
		}
	}
	e.Allow, e.Deny = out, dout
	if len(e.Allow) == 0 {
		e.Allow = nil
	}
	if len(e.Deny) == 0 {
		e.Deny = nil
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
	// HostDNS: the sandbox's container was made before the forwarder and
	// asks the host's resolvers, which a public or learn policy then
	// reaches on port 53 (its names match nothing) until it is made again.
	HostDNS bool
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

// EgressDecision is one line of a sandbox's egress log: the connections
// to one destination, aggregated.
type EgressDecision struct {
	// First and Last are when the first and the latest were seen.
	First time.Time  `json:"first"`
	Last  time.Time  `json:"last"`
	Addr  netip.Addr `json:"addr"`
	Port  uint16     `json:"port,omitempty"`
	// Proto is "tcp", "udp" or "icmp".
	Proto string `json:"proto"`
	// Name is the name the address was looked up as through the
	// forwarder, when it was.
	Name    string `json:"name,omitempty"`
	Allowed bool   `json:"allowed"`
	// Count is the connections (allowed) or packets (denied) seen.
	Count uint64 `json:"count"`
}

// EgressLookup is one name a sandbox looked up through the forwarder.
type EgressLookup struct {
	Name string `json:"name"`
	// Addrs is the latest answer's IPv4 addresses.
	Addrs []netip.Addr `json:"addrs,omitempty"`
	// Allowed: the policy lets the sandbox reach the answer (its
	// addresses entered the sandbox's sets, or the policy is public or
	// learn and no deny entry names it).
	Allowed bool      `json:"allowed"`
	Count   uint64    `json:"count"`
	Last    time.Time `json:"last"`
}

// EgressLog is what a sandbox tried, newest first, bounded.
type EgressLog struct {
	Decisions []EgressDecision `json:"decisions"`
	Lookups   []EgressLookup   `json:"lookups"`
}

// LearningObserver is implemented by EgressObservers that tell which
// sandboxes under the learn policy logged something new: the activity
// flush keeps what they learned in their records.
type LearningObserver interface {
	// TakeLearning returns the logs of the sandboxes under the learn
	// policy whose log gained a line since the last call, by id.
	TakeLearning() map[string]EgressLog
}

// EgressObserver is implemented by firewalls that see what sandboxes try:
// the kernel's log of their connections and the forwarder's of their
// lookups.
type EgressObserver interface {
	// EgressLog is sandbox id's log (empty when none).
	EgressLog(id string) EgressLog
	// OnDenied sets the function told of sandboxes' refused egress,
	// already bounded by the firewall: an EventEgressDenied per denied
	// destination (a few dozen per sandbox a minute), then an
	// EventEgressDeniedSummary counting the rest. fn records the event,
	// without incarnation or labels, as its sandbox's and reports whether
	// the sandbox has a record (a window of one without ends unsummarised).
	OnDenied(fn func(ev Event) bool)
	// ForgetDenials drops what the firewall counts of sandbox id's
	// refused egress: its record is gone, and a sandbox made again under
	// the id starts afresh.
	ForgetDenials(id string)
	// Outbound reports when the sandbox at addr last worked outbound: now
	// while it holds an established outbound connection, else its last
	// lookup; zero when never.
	Outbound(addr netip.Addr) time.Time
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
