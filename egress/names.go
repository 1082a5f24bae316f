package egress

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables/expr"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file holds what the firewall knows of each sandbox beyond its
// chain: the name rules of its policy, the answers the forwarder gave it
// (by name, with their expiry), and the sets those answers fill. A set's
// contents are a function of the rules and the answers: whenever either
// changes, the set is written again from them, so a PATCH that removes a
// name takes its addresses away, and one that adds a name the sandbox
// already looked up opens it at once.

// Set name prefixes: the addresses of allowed and of denied names, one
// set per protocol and port the sandbox's name rules use.
const (
	setPrefixAllow = "na-"
	setPrefixDeny  = "nd-"
)

// maxAnswers bounds the answers kept per sandbox; the oldest to expire go
// first.
const maxAnswers = 512

// setKey is one protocol and port (0: every port) of name rules.
type setKey struct {
	proto string
	port  uint16
}

func (k setKey) String() string {
	return k.proto[:1] + strconv.Itoa(int(k.port))
}

// match: meta l4proto <p> [th dport <n>].
func (k setKey) match() []expr.Any { return protoPort(k.proto, k.port) }

// answer is what the forwarder last answered a sandbox for one name.
type answer struct {
	addrs   []netip.Addr
	expires time.Time
}

// sandbox is the firewall's state of one sandbox.
type sandbox struct {
	id string
	// Set by the firewall under sb.mu (and f.smu for the maps).
	addr    netip.Addr
	egress  lifecycle.Egress
	allow   []lifecycle.AllowRule // name rules
	deny    []lifecycle.AllowRule // name rules (public and learn)
	hostDNS bool

	// mu orders the writes of this sandbox's sets: the forwarder's
	// answers and the firewall's rewrites. It is held across their
	// netlink commits, so what only reads takes the two below: rmu for
	// the rules (written under both), amu for the answers.
	mu      sync.Mutex
	rmu     sync.RWMutex
	amu     sync.Mutex
	answers map[string]answer
	// written is what the forwarder last wrote of each set element
	// ("set|addr"), pruned with the answers.
	written map[string]written
	// inflight counts the queries of this sandbox being forwarded.
	inflight atomic.Int32
	// lastLookup and lastConnect are unix nanoseconds.
	lastLookup  atomic.Int64
	lastConnect atomic.Int64
	log         *activityLog
}

func newSandbox(id string) *sandbox {
	return &sandbox{id: id, answers: map[string]answer{}, written: map[string]written{}, log: newActivityLog()}
}

// written is an element as last written: its timeout and expiry.
type written struct {
	timeout time.Duration
	expires time.Time
}

// setRules takes e's name rules; the caller holds sb.mu.
func (sb *sandbox) setRules(e lifecycle.FirewallEntry) {
	sb.rmu.Lock()
	defer sb.rmu.Unlock()
	sb.addr, sb.egress, sb.hostDNS = e.Address, e.Egress, e.HostDNS
	sb.allow, sb.deny = nil, nil
	for _, r := range e.Egress.Rules() {
		if r.IsName() {
			sb.allow = append(sb.allow, r)
		}
	}
	if e.Egress.Policy != lifecycle.EgressNone {
		for _, r := range e.Egress.DenyRules() {
			if r.IsName() {
				sb.deny = append(sb.deny, r)
			}
		}
	}
}

func keysOf(rules []lifecycle.AllowRule) []setKey {
	var out []setKey
	for _, r := range rules {
		for _, p := range protos(r) {
			if k := (setKey{p, r.Port}); !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	slices.SortFunc(out, func(a, b setKey) int {
		if c := strings.Compare(a.proto, b.proto); c != 0 {
			return c
		}
		return int(a.port) - int(b.port)
	})
	return out
}

func (sb *sandbox) allowKeys() []setKey { return keysOf(sb.allow) }
func (sb *sandbox) denyKeys() []setKey  { return keysOf(sb.deny) }

func (sb *sandbox) setName(prefix string, k setKey) string {
	return prefix + sb.id + "-" + k.String()
}

// setNames are every set the sandbox's rules use.
func (sb *sandbox) setNames() []string {
	var out []string
	for _, k := range sb.allowKeys() {
		out = append(out, sb.setName(setPrefixAllow, k))
	}
	for _, k := range sb.denyKeys() {
		out = append(out, sb.setName(setPrefixDeny, k))
	}
	return out
}

// setIndex holds name sets by the sandbox they belong to (setOwner).
type setIndex map[string]map[string]bool

// add records set under its owner; a set of no sandbox is left out.
func (x setIndex) add(set string) {
	id := setOwner(set)
	if id == "" {
		return
	}
	if x[id] == nil {
		x[id] = map[string]bool{}
	}
	x[id][set] = true
}

func (x setIndex) has(set string) bool { return x[setOwner(set)][set] }

// setOwner is the sandbox id a name set belongs to ("" for another set).
func setOwner(name string) string {
	for _, p := range []string{setPrefixAllow, setPrefixDeny} {
		if rest, ok := strings.CutPrefix(name, p); ok {
			if i := strings.LastIndexByte(rest, '-'); i > 0 {
				return rest[:i]
			}
		}
	}
	return ""
}

// element is one address of a set, with the time it has left.
type element struct {
	addr    netip.Addr
	timeout time.Duration
}

// contents are what each of the sandbox's sets must hold at now, from
// the answers kept: an allowed name's addresses (those in a denied range
// only where the operator's egress_allow_private opens them), a denied
// name's addresses. The caller holds sb.mu.
func (sb *sandbox) contents(now time.Time, private func(netip.Addr, lifecycle.AllowRule) bool) map[string][]element {
	out := map[string][]element{}
	for _, n := range sb.setNames() {
		out[n] = nil
	}
	sb.amu.Lock()
	defer sb.amu.Unlock()
	for name, a := range sb.answers {
		left := a.expires.Sub(now).Truncate(time.Millisecond)
		if left < time.Second {
			continue
		}
		sb.fill(out, name, a.addrs, left, private)
	}
	return out
}

// fill adds to sets what an answer for name opens or refuses.
func (sb *sandbox) fill(sets map[string][]element, name string, addrs []netip.Addr, left time.Duration, private func(netip.Addr, lifecycle.AllowRule) bool) {
	// An allowed name's addresses open only outside the denied ranges (or
	// where egress_allow_private says); a denied one's are refused
	// wherever they are.
	sb.fillRules(sets, sb.allow, setPrefixAllow, name, addrs, left, private)
	sb.fillRules(sets, sb.deny, setPrefixDeny, name, addrs, left, nil)
}

// fillRules adds to sets, under prefix, the addresses of an answer for name
// that each matching rule takes (all of them when keep is nil).
func (sb *sandbox) fillRules(sets map[string][]element, rules []lifecycle.AllowRule, prefix, name string, addrs []netip.Addr, left time.Duration, keep func(netip.Addr, lifecycle.AllowRule) bool) {
	for _, r := range rules {
		if !matchName(r, name) {
			continue
		}
		for _, p := range protos(r) {
			set := sb.setName(prefix, setKey{p, r.Port})
			for _, a := range addrs {
				if keep == nil || keep(a, r) {
					sets[set] = appendElement(sets[set], element{a, left})
				}
			}
		}
	}
}

// appendElement adds e, or lengthens the time of the same address.
func appendElement(l []element, e element) []element {
	for i := range l {
		if l[i].addr == e.addr {
			l[i].timeout = max(l[i].timeout, e.timeout)
			return l
		}
	}
	return append(l, e)
}

// judge reads the policy and whether its name rules allow or deny name,
// under rmu: not mu, which an answer's commit for another query holds.
func (sb *sandbox) judge(name string) (policy string, allowed, denied bool) {
	sb.rmu.RLock()
	defer sb.rmu.RUnlock()
	return sb.egress.Policy, sb.allowed(name), sb.denied(name)
}

// allowed reports whether a name entry allows name; denied whether one
// denies it.
func (sb *sandbox) allowed(name string) bool {
	return slices.ContainsFunc(sb.allow, func(r lifecycle.AllowRule) bool { return matchName(r, name) })
}

func (sb *sandbox) denied(name string) bool {
	return slices.ContainsFunc(sb.deny, func(r lifecycle.AllowRule) bool { return matchName(r, name) })
}

// matchName reports whether the name entry r covers the DNS name n (lower
// case, without the final dot).
func matchName(r lifecycle.AllowRule, n string) bool {
	if base, ok := strings.CutPrefix(r.Name, "*."); ok {
		return len(n) > len(base)+1 && strings.HasSuffix(n, base) && n[len(n)-len(base)-1] == '.'
	}
	return r.Name != "" && n == r.Name
}

// remember keeps an answer (bounded: the one expiring first goes). The
// caller holds sb.mu (written is its).
func (sb *sandbox) remember(name string, addrs []netip.Addr, expires time.Time, now time.Time) {
	sb.amu.Lock()
	defer sb.amu.Unlock()
	for n, a := range sb.answers {
		if !a.expires.After(now) {
			delete(sb.answers, n)
		}
	}
	for k, w := range sb.written {
		if !w.expires.After(now) {
			delete(sb.written, k)
		}
	}
	if _, ok := sb.answers[name]; !ok && len(sb.answers) >= maxAnswers {
		first := ""
		for n, a := range sb.answers {
			if first == "" || a.expires.Before(sb.answers[first].expires) {
				first = n
			}
		}
		delete(sb.answers, first)
	}
	sb.answers[name] = answer{addrs: addrs, expires: expires}
}

// nameOf is the name an address was last looked up as, "" when none.
func (sb *sandbox) nameOf(a netip.Addr) string {
	sb.amu.Lock()
	defer sb.amu.Unlock()
	best, bestExp := "", time.Time{}
	for n, ans := range sb.answers {
		if slices.Contains(ans.addrs, a) && ans.expires.After(bestExp) {
			best, bestExp = n, ans.expires
		}
	}
	return best
}
