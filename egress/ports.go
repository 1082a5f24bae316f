package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// This file finds a sandbox's bridge port: the host end of the veth pair
// Docker makes at every start, whose other end is the container's eth0.
// Docker does not say its name; the kernel does. The host end's link
// carries the id, in this namespace, of the namespace its peer lives in
// (IFLA_LINK_NETNSID), and RTM_GETNSID maps a process's namespace to that
// id. Neither needs more privilege than reading the links (no setns into
// the container's namespace, which would need CAP_SYS_ADMIN).

// errNoPort: no port of the bridge leads into the process's namespace
// (the container is not on the bridge, or it stopped meanwhile).
var errNoPort = errors.New("no port of the bridge leads into the container's network namespace")

// bridgePort returns the name of bridge's port into the network namespace
// of process pid.
func bridgePort(bridge string, pid int) (string, error) {
	br, err := net.InterfaceByName(bridge)
	if err != nil {
		return "", fmt.Errorf("finding bridge %s: %w", bridge, err)
	}
	c, err := newRouteConn()
	if err != nil {
		return "", err
	}
	defer c.Close()
	// The dump first: listing a veth whose peer namespace has no id here
	// yet gives it one, which RTM_GETNSID then reports.
	ports, err := bridgePorts(c, br.Index)
	if err != nil {
		return "", err
	}
	nsid, err := namespaceID(c, pid)
	if err != nil {
		return "", err
	}
	var found string
	for _, p := range ports {
		if p.nsid == nsid && p.hasNSID {
			if found != "" {
				return "", fmt.Errorf("bridge %s has two ports (%s, %s) into the namespace of process %d", bridge, found, p.name, pid)
			}
			found = p.name
		}
	}
	if found == "" {
		return "", fmt.Errorf("process %d: %w %s", pid, errNoPort, bridge)
	}
	return found, nil
}

// port is one link enslaved to the bridge.
type port struct {
	name    string
	nsid    int32
	hasNSID bool
}

// bridgePorts lists the links whose master is the bridge of index master.
func bridgePorts(c *netlink.Conn, master int) ([]port, error) {
	req := netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request | netlink.Dump},
		Data:   make([]byte, unix.SizeofIfInfomsg), // AF_UNSPEC: every link
	}
	msgs, err := c.Execute(req)
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []port
	for _, m := range msgs {
		if len(m.Data) < unix.SizeofIfInfomsg {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[unix.SizeofIfInfomsg:])
		if err != nil {
			continue
		}
		var p port
		isPort := false
		for ad.Next() {
			switch ad.Type() {
			case unix.IFLA_IFNAME:
				p.name = ad.String()
			case unix.IFLA_MASTER:
				isPort = int(ad.Uint32()) == master
			case unix.IFLA_LINK_NETNSID:
				p.nsid, p.hasNSID = int32(ad.Uint32()), true
			}
		}
		if ad.Err() == nil && isPort && p.name != "" {
			out = append(out, p)
		}
	}
	return out, nil
}

// namespaceID is the id this namespace gives the network namespace of
// process pid (-1 when it has none).
func namespaceID(c *netlink.Conn, pid int) (int32, error) {
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(unix.NETNSA_PID, uint32(pid))
	attrs, err := ae.Encode()
	if err != nil {
		return 0, err
	}
	// struct rtgenmsg, padded to the netlink alignment.
	data := append(make([]byte, rtgenmsgLen), attrs...)
	msgs, err := c.Execute(netlink.Message{Header: netlink.Header{Type: unix.RTM_GETNSID, Flags: netlink.Request}, Data: data})
	if errors.Is(err, unix.ESRCH) {
		return 0, fmt.Errorf("the container's process %d is not visible to the gateway: it must run in the Docker host's PID namespace (pid: host in compose, hostPID in Kubernetes) to bind sandboxes to their bridge ports", pid)
	}
	if err != nil {
		return 0, fmt.Errorf("reading the network namespace id of process %d: %w", pid, err)
	}
	for _, m := range msgs {
		if len(m.Data) < rtgenmsgLen {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[rtgenmsgLen:])
		if err != nil {
			continue
		}
		for ad.Next() {
			if ad.Type() == unix.NETNSA_NSID {
				return int32(binary.NativeEndian.Uint32(ad.Bytes())), nil
			}
		}
	}
	return 0, fmt.Errorf("process %d: the kernel gave no namespace id", pid)
}

// rtgenmsgLen is struct rtgenmsg (one byte) padded to netlink's 4-byte
// alignment.
const rtgenmsgLen = 4

// newRouteConn opens an rtnetlink socket.
func newRouteConn() (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	return c, nil
}
