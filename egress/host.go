package egress

import (
	"bufio"
	"net"
	"net/netip"
	"os"
	"strings"
)

// HostAddresses are the IPv4 addresses of this network namespace's
// interfaces, each as a /32: a public policy denies them all, so a
// sandbox reaches no listener of its host (the INPUT path), whatever
// address it is bound to.
func HostAddresses() []netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ip, ok := netip.AddrFromSlice(ipn.IP); ok && ip.Unmap().Is4() {
			out = append(out, netip.PrefixFrom(ip.Unmap(), 32))
		}
	}
	return out
}

// resolvConfs are where Docker reads the upstream resolvers it forwards
// containers' queries to: the host's file, or systemd-resolved's real
// list when the host's names only its loopback stub.
var resolvConfs = []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"}

// HostResolvers are the IPv4 nameservers Docker's embedded DNS forwards
// to, as Docker picks them: the host's resolv.conf without loopback
// entries (a stub resolver's), falling back to systemd-resolved's list.
func HostResolvers() []netip.Addr {
	for _, path := range resolvConfs {
		if rs := readResolvers(path); len(rs) > 0 {
			return rs
		}
	}
	return []netip.Addr{}
}

func readResolvers(path string) []netip.Addr {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil || !a.Is4() || a.IsLoopback() {
			continue
		}
		out = append(out, a)
	}
	return out
}
