package egress

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

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

// sandboxRules are the rules of one sandbox's chain, in order:
//
//	fib daddr type local meta l4proto tcp counter name <c> reject with tcp reset
//	fib daddr type local counter name <c> reject with icmpx admin-prohibited
//	ip daddr <allow> [meta l4proto <p> [th dport <n>]] accept   (each allow entry)
//	ip daddr <resolver> meta l4proto udp|tcp th dport 53 accept (public only)
//	[ip daddr @denied] meta l4proto tcp counter name <c> reject with tcp reset
//	[ip daddr @denied] counter name <c> reject with icmpx admin-prohibited
//	accept                                                      (public only)
//
// Every packet the sandbox originates is judged, not only a connection's
// first: a policy made stricter cuts the connections it now forbids at
// their next packet.
//
// The first two judge what the input path brings: every packet there is
// for an address of the host, whatever list it is on, an address added
// after the gateway started and a route that makes a range local (AnyIP)
// included. A sandbox reaches no listener of its host, whatever its policy
// or allow list (its answers to the gateway pass as replies before).
func sandboxRules(e lifecycle.Egress, resolvers []netip.Addr, counter string) [][]expr.Any {
	local := fibDaddrLocal()
	rules := [][]expr.Any{
		cat(local, l4proto(unix.IPPROTO_TCP), []expr.Any{counterRef(counter), rejectTCP()}),
		cat(local, []expr.Any{counterRef(counter), rejectOther()}),
	}
	for _, r := range e.Rules() {
		proto := byte(unix.IPPROTO_TCP)
		if r.Proto == "udp" {
			proto = unix.IPPROTO_UDP
		}
		rule := cat(ipPrefix(offDaddr, r.Prefix), l4proto(proto))
		if r.Port != 0 {
			rule = cat(rule, dport(r.Port))
		}
		rules = append(rules, append(rule, verdict(expr.VerdictAccept)))
	}
	public := e.Policy != lifecycle.EgressNone
	var deny []expr.Any
	if public {
		for _, a := range resolvers {
			for _, p := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
				rules = append(rules, cat(ipPrefix(offDaddr, netip.PrefixFrom(a, 32)), l4proto(p), dport(53), []expr.Any{verdict(expr.VerdictAccept)}))
			}
		}
		deny = ipInSet(offDaddr, setDenied)
	}
	rules = append(rules,
		cat(deny, l4proto(unix.IPPROTO_TCP), []expr.Any{counterRef(counter), rejectTCP()}),
		cat(deny, []expr.Any{counterRef(counter), rejectOther()}),
	)
	if public {
		rules = append(rules, []expr.Any{verdict(expr.VerdictAccept)})
	}
	return rules
}
