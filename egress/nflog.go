package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"time"

	nflog "github.com/florianl/go-nflog/v2"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// This file reads the kernel's log of the table's allowed and refused
// chains (an NFLOG group of the firewall's own) into each sandbox's
// egress log: new connections allowed, packets refused, by source
// address, destination, port and protocol. Nothing is polled; the kernel
// sends each logged packet's headers (at most 1,000 a second of each
// kind, the rules' limit).

// logGroup is the NFLOG group of the table of bridge: one of its own, so
// that gateways (or tests) on one host never read each other's log.
func logGroup(bridge string) uint16 {
	h := fnv.New32a()
	h.Write([]byte(bridge))
	return uint16(1000 + h.Sum32()%60000)
}

// startLog starts reading group; it returns once the socket is bound.
func (f *Firewall) startLog(group uint16) error {
	nf, err := nflog.Open(&nflog.Config{Group: group, Copymode: nflog.CopyPacket, Bufsize: 64, Timeout: 5, QThresh: 32})
	if err != nil {
		return fmt.Errorf("opening the egress log (NFLOG group %d): %w", group, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hook := func(a nflog.Attribute) int {
		if a.Prefix != nil && a.Payload != nil {
			f.logged(*a.Prefix, *a.Payload, time.Now())
		}
		return 0
	}
	errf := func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		var op interface{ Timeout() bool }
		if errors.As(err, &op) && op.Timeout() {
			return 0
		}
		f.log.Debug("egress log", zap.Error(err))
		return 0
	}
	if err := nf.RegisterWithErrorFunc(ctx, hook, errf); err != nil {
		cancel()
		nf.Close()
		return fmt.Errorf("reading the egress log (NFLOG group %d): %w", group, err)
	}
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		f.sweepDenials(ctx)
	}()
	f.stopLog = func() {
		cancel()
		nf.Close()
		<-swept
	}
	return nil
}

// logged counts one logged packet in its sandbox's log.
func (f *Firewall) logged(prefix string, pkt []byte, now time.Time) {
	src, k, ok := parseHeaders(pkt)
	if !ok {
		return
	}
	k.allowed = prefix == logAllowed
	f.smu.RLock()
	sb := f.byAddr[src]
	f.smu.RUnlock()
	if sb == nil {
		return
	}
	if k.allowed {
		sb.lastConnect.Store(now.UnixNano())
	}
	d, report := sb.log.decision(k, sb.nameOf(k.addr), now)
	if report {
		f.reportDenied(sb.id, d)
	}
}

// parseHeaders reads an IPv4 packet's source, destination, protocol and
// destination port.
func parseHeaders(pkt []byte) (netip.Addr, decisionKey, bool) {
	if len(pkt) < 20 || pkt[0]>>4 != 4 {
		return netip.Addr{}, decisionKey{}, false
	}
	ihl := int(pkt[0]&0x0f) * 4
	src := netip.AddrFrom4([4]byte(pkt[12:16]))
	k := decisionKey{addr: netip.AddrFrom4([4]byte(pkt[16:20]))}
	switch pkt[9] {
	case unix.IPPROTO_TCP:
		k.proto = "tcp"
	case unix.IPPROTO_UDP:
		k.proto = "udp"
	case unix.IPPROTO_ICMP:
		k.proto = "icmp"
	default:
		k.proto = fmt.Sprintf("ip-%d", pkt[9])
	}
	if (k.proto == "tcp" || k.proto == "udp") && len(pkt) >= ihl+4 {
		k.port = binary.BigEndian.Uint16(pkt[ihl+2 : ihl+4])
	}
	return src, k, true
}
