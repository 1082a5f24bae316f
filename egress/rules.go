package egress

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/sandwake/sandwake/egress/dnswire"
	"github.com/sandwake/sandwake/lifecycle"
)

// This file builds the nftables expressions of the firewall's rules. The
// comment above each builder says the rule in nft's own syntax.

// Register numbers as nftables names them.
const (
	regVerdict = 0
	reg1       = 1
)

// ifname is an interface name as the kernel compares it (NUL-padded to
// IFNAMSIZ).
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// matchIif: iifname <name>; matchOif: oifname <name>; negated with op.
func matchIf(key expr.MetaKey, name string, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Cmp{Op: op, Register: reg1, Data: ifname(name)},
	}
}

// ctDirection: ct direction original|reply.
func ctDirection(dir byte) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyDIRECTION, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{dir}},
	}
}

// Conntrack directions (enum ip_conntrack_dir).
const (
	dirOriginal = 0
	dirReply    = 1
)

// ctNew: ct state new.
func ctNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}
}

// nfproto: meta nfproto ipv4|ipv6.
func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}},
	}
}

// l4proto: meta l4proto tcp|udp.
func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}},
	}
}

// IPv4 header offsets.
const (
	offSaddr = 12
	offDaddr = 16
)

// ipPrefix: ip saddr|daddr <prefix>.
func ipPrefix(off uint32, p netip.Prefix) []expr.Any {
	out := []expr.Any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}}
	net := p.Masked().Addr().As4()
	if p.Bits() < 32 {
		mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
		out = append(out, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: mask, Xor: make([]byte, 4)})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: net[:]})
}

// ipInSet: ip saddr|daddr @set.
func ipInSet(off uint32, set string) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Lookup{SourceRegister: reg1, SetName: set},
	}
}

// dport: th dport <port> (the protocol is matched before).
func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

// fibDaddrLocal: fib daddr type local.
func fibDaddrLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

// counterRef: counter name <name>.
func counterRef(name string) expr.Any {
	return &expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name}
}

// rejectTCP: reject with tcp reset; rejectOther: reject with icmpx
// admin-prohibited. A refused app fails at once instead of waiting for a
// timeout.
func rejectTCP() expr.Any { return &expr.Reject{Type: unix.NFT_REJECT_TCP_RST} }

func rejectOther() expr.Any {
	return &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}
}

func cat(parts ...[]expr.Any) []expr.Any { return slices.Concat(parts...) }

// protos are the protocols rule r opens: its own, or both for a name
// entry that names none.
func protos(r lifecycle.AllowRule) []string {
	if r.Proto == "" {
		return []string{"tcp", "udp"}
	}
	return []string{r.Proto}
}

// sandboxRules are the rules of one sandbox's chain, in order:
//
//	ip daddr <gateway> meta l4proto udp|tcp th dport 53 accept       (the forwarder)
//	fib daddr type local counter name <c> goto refused                (the host, by kind)
//	ip daddr <resolver> meta l4proto udp|tcp th dport 53 accept       (HostDNS, public only)
//	meta l4proto tcp|udp th dport 53|853 counter name <c> goto refused (DNS elsewhere)
//	ip daddr <deny> [meta l4proto <p> [th dport <n>]] counter name <c> goto refused
//	ip daddr @nd-<id>-<k> … counter name <c> goto refused            (denied names' answers)
//	ip daddr <allow> [meta l4proto <p> [th dport <n>]] goto allowed
//	meta l4proto <p> [th dport <n>] ip daddr @na-<id>-<k> update @na-<id>-<k> { ip daddr timeout <max> } goto allowed
//	[ip daddr @denied] counter name <c> goto refused
//	goto allowed                                                      (public and learn)
//
// Every packet the sandbox originates is judged, not only a connection's
// first: a policy made stricter cuts the connections it now forbids at
// their next packet. A packet to an allowed name's address keeps the
// address in its set for maxTTL more (an open connection is not cut when
// the answer's TTL runs out).
//
// The local rule judges what the input path brings: every packet there is
// for an address of the host, whatever list it is on, an address added
// after the gateway started and a route that makes a range local (AnyIP)
// included. A sandbox reaches no listener of its host but the forwarder,
// whatever its policy or allow list (its answers to the gateway pass as
// replies before).
func sandboxRules(sb *sandbox, gateway netip.Addr, resolvers []netip.Addr, counter string, maxTTL uint32) [][]expr.Any {
	e := sb.egress
	refuse := []expr.Any{counterRef(counter), gotoChain(chainRefused)}
	var rules [][]expr.Any
	for _, p := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rules = append(rules, cat(nfproto(unix.NFPROTO_IPV4), ipPrefix(offDaddr, netip.PrefixFrom(gateway, 32)), l4proto(p), dport(dnswire.Port), []expr.Any{verdict(expr.VerdictAccept)}))
	}
	rules = append(rules, cat(fibDaddrLocal(), refuse))
	public := e.Policy != lifecycle.EgressNone
	if public && sb.hostDNS {
		for _, a := range resolvers {
			for _, p := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
				rules = append(rules, cat(ipPrefix(offDaddr, netip.PrefixFrom(a, 32)), l4proto(p), dport(dnswire.Port), []expr.Any{gotoChain(chainAllowed)}))
			}
		}
	}
	for _, p := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		for _, port := range []uint16{dnswire.Port, portDoT} {
			rules = append(rules, cat(l4proto(p), dport(port), refuse))
		}
	}
	if public {
		for _, r := range e.DenyRules() {
			if r.IsName() {
				continue
			}
			if r.Proto == "" && r.Port == 0 {
				rules = append(rules, cat(ipPrefix(offDaddr, r.Prefix), refuse)) // every protocol, ICMP too
				continue
			}
			for _, p := range protos(r) {
				rules = append(rules, cat(ipPrefix(offDaddr, r.Prefix), protoPort(p, r.Port), refuse))
			}
		}
		for _, k := range sb.denyKeys() {
			rules = append(rules, cat(k.match(), ipInSet(offDaddr, sb.setName(setPrefixDeny, k)), refuse))
		}
	}
	for _, r := range e.Rules() {
		if r.IsName() {
			continue
		}
		rules = append(rules, cat(ipPrefix(offDaddr, r.Prefix), protoPort(r.Proto, r.Port), []expr.Any{gotoChain(chainAllowed)}))
	}
	for _, k := range sb.allowKeys() {
		set := sb.setName(setPrefixAllow, k)
		rules = append(rules, cat(k.match(), ipInSet(offDaddr, set), []expr.Any{
			&expr.Dynset{SrcRegKey: reg1, SetName: set, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE), Timeout: time.Duration(maxTTL) * time.Second},
			gotoChain(chainAllowed),
		}))
	}
	if public {
		rules = append(rules, cat(ipInSet(offDaddr, setDenied), refuse), []expr.Any{gotoChain(chainAllowed)})
	} else {
		rules = append(rules, refuse)
	}
	return rules
}

// protoPort: meta l4proto <p> [th dport <n>]; nothing for proto "" (both).
func protoPort(proto string, port uint16) []expr.Any {
	if proto == "" {
		return nil
	}
	out := l4proto(protoNum(proto))
	if port != 0 {
		out = cat(out, dport(port))
	}
	return out
}

func protoNum(proto string) byte {
	if proto == "udp" {
		return unix.IPPROTO_UDP
	}
	return unix.IPPROTO_TCP
}

func gotoChain(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain} }

// The log group's prefixes: what the allowed and refused chains log.
const (
	logAllowed = "a"
	logRefused = "d"
)

// logTo: log group <g> prefix <p> snaplen 64 (the headers).
func logTo(group uint16, prefix string) expr.Any {
	return &expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN, Group: group, Data: []byte(prefix), Snaplen: 64}
}

// limitRate: limit rate <n>/second burst <n> packets (matches under it).
func limitRate(n uint64) expr.Any {
	return &expr.Limit{Type: expr.LimitTypePkts, Rate: n, Unit: expr.LimitTimeSecond, Burst: uint32(n)}
}

// verdictChains are the table's shared tails of every sandbox chain:
//
//	chain allowed { ct state new limit rate 1000/second log group <g> prefix "a"; accept }
//	chain refused { limit rate 1000/second log group <g> prefix "d"
//	                meta l4proto tcp reject with tcp reset
//	                reject with icmpx admin-prohibited }
//
// The log is what the egress log reads (nflog.go); over the rate the
// packets are judged the same, unlogged.
func verdictChains(group uint16) map[string][][]expr.Any {
	return map[string][][]expr.Any{
		chainAllowed: {
			cat(ctNew(), []expr.Any{limitRate(1000), logTo(group, logAllowed)}),
			{verdict(expr.VerdictAccept)},
		},
		chainRefused: {
			{limitRate(1000), logTo(group, logRefused)},
			cat(l4proto(unix.IPPROTO_TCP), []expr.Any{rejectTCP()}),
			{rejectOther()},
		},
	}
}
