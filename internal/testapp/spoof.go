package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
)

// These endpoints send what code given NET_RAW could: a datagram with
// another source address, and a gratuitous ARP claiming another address.
// The tests check that neither leaves the sandbox's own port.

// rawHandler serves /raw?src=<ipv4>&dst=<ipv4:port>&payload=<text>: one
// UDP datagram from src (any address, not only the sandbox's) to dst,
// written through a raw IP socket. 200 "sent" once the kernel took it.
func rawHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	src, err1 := netip.ParseAddr(q.Get("src"))
	dst, err2 := netip.ParseAddrPort(q.Get("dst"))
	if err1 != nil || err2 != nil || !src.Is4() || !dst.Addr().Is4() {
		http.Error(w, "src=<ipv4>&dst=<ipv4:port> needed", http.StatusBadRequest)
		return
	}
	payload := []byte(q.Get("payload"))
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		http.Error(w, "raw socket: "+err.Error(), http.StatusForbidden)
		return
	}
	defer syscall.Close(fd)
	pkt := make([]byte, 28, 28+len(payload))
	pkt[0] = 0x45 // IPv4, 20-byte header
	pkt[8] = 64   // TTL
	pkt[9] = syscall.IPPROTO_UDP
	s, d := src.As4(), dst.Addr().As4()
	copy(pkt[12:16], s[:])
	copy(pkt[16:20], d[:])
	// The kernel fills the total length, id and header checksum; a UDP
	// checksum of zero means none.
	binary.BigEndian.PutUint16(pkt[20:], 40000)
	binary.BigEndian.PutUint16(pkt[22:], dst.Port())
	binary.BigEndian.PutUint16(pkt[24:], uint16(8+len(payload)))
	pkt = append(pkt, payload...)
	if err := syscall.Sendto(fd, pkt, 0, &syscall.SockaddrInet4{Addr: d}); err != nil {
		http.Error(w, "send: "+err.Error(), http.StatusBadGateway)
		return
	}
	fmt.Fprintln(w, "sent")
}

// garpHandler serves /garp?ip=<ipv4>: a gratuitous ARP reply, broadcast
// on eth0, saying that ip is at this sandbox's MAC.
func garpHandler(w http.ResponseWriter, r *http.Request) {
	ip, err := netip.ParseAddr(r.URL.Query().Get("ip"))
	if err != nil || !ip.Is4() {
		http.Error(w, "ip=<ipv4> needed", http.StatusBadRequest)
		return
	}
	ifc, err := net.InterfaceByName("eth0")
	if err != nil || len(ifc.HardwareAddr) != 6 {
		http.Error(w, fmt.Sprintf("eth0: %v", err), http.StatusInternalServerError)
		return
	}
	fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, int(htons(syscall.ETH_P_ARP)))
	if err != nil {
		http.Error(w, "packet socket: "+err.Error(), http.StatusForbidden)
		return
	}
	defer syscall.Close(fd)
	bcast := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	a := ip.As4()
	f := make([]byte, 0, 42)
	f = append(f, bcast...)
	f = append(f, ifc.HardwareAddr...)
	f = append(f, 0x08, 0x06)                // ARP
	f = append(f, 0, 1, 0x08, 0, 6, 4, 0, 2) // Ethernet, IPv4, reply
	f = append(f, ifc.HardwareAddr...)
	f = append(f, a[:]...)
	f = append(f, bcast...)
	f = append(f, a[:]...)
	sa := &syscall.SockaddrLinklayer{Protocol: htons(syscall.ETH_P_ARP), Ifindex: ifc.Index, Halen: 6}
	copy(sa.Addr[:], bcast)
	if err := syscall.Sendto(fd, f, 0, sa); err != nil {
		http.Error(w, "send: "+err.Error(), http.StatusBadGateway)
		return
	}
	fmt.Fprintln(w, "sent", ifc.HardwareAddr)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
