package egress

import (
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// span is a closed range of IPv4 addresses.
type span struct{ lo, hi uint32 }

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// mergeSpans turns IPv4 prefixes, overlapping or not, into sorted,
// disjoint, non-adjacent spans (an nftables interval set refuses
// overlapping elements).
func mergeSpans(ps []netip.Prefix) []span {
	var spans []span
	for _, p := range ps {
		if !p.Addr().Is4() {
			continue
		}
		p = p.Masked()
		lo := u32(p.Addr())
		hi := lo | (^uint32(0) >> p.Bits())
		if p.Bits() == 0 {
			hi = ^uint32(0)
		}
		spans = append(spans, span{lo, hi})
	}
	slices.SortFunc(spans, func(a, b span) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	var out []span
	for _, s := range spans {
		if n := len(out); n > 0 && (s.lo <= out[n-1].hi || (out[n-1].hi != ^uint32(0) && s.lo == out[n-1].hi+1)) {
			out[n-1].hi = max(out[n-1].hi, s.hi)
			continue
		}
		out = append(out, s)
	}
	return out
}

// intervalElements are the elements of an interval set holding spans: a
// start element and an end element one past each span (none past the
// last address), with the leading end element the kernel expects when the
// first span does not start at 0.0.0.0.
func intervalElements(spans []span) []nftables.SetElement {
	var els []nftables.SetElement
	if len(spans) > 0 && spans[0].lo != 0 {
		els = append(els, nftables.SetElement{Key: []byte{0, 0, 0, 0}, IntervalEnd: true})
	}
	for _, s := range spans {
		lo := addr4(s.lo).As4()
		els = append(els, nftables.SetElement{Key: lo[:]})
		if s.hi != ^uint32(0) {
			end := addr4(s.hi + 1).As4()
			els = append(els, nftables.SetElement{Key: end[:], IntervalEnd: true})
		}
	}
	return els
}
