package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/mdlayher/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// This file scopes the bridge table (bindings.go) to sandwake's own
// bridge. The bridge family's hook sees the frames of every bridge of the
// host, and this kernel cannot say which bridge a frame entered (no "meta
// ibrname"): a rule that judged frames by address alone cut off any other
// bridge whose subnet overlaps the sandbox network's (another Docker
// network on a reused subnet, a plain bridge, CNI, libvirt), while the
// gateway ran and after it stopped. So every rule of the table starts with
// "iif @ports", and the set holds the bridge's ports, bound or not: listed
// at Setup, then kept from the kernel's link notifications (RTMGRP_LINK)
// by a goroutine the Firewall owns. A link whose master is the bridge is
// added; one that leaves it, or is deleted, is removed. Bind ensures its
// port again.
//
// Interface indexes, not names: the kernel hands indexes out in turn and
// gives none again before the space wraps (unless one is asked for by
// number), whereas a name (vethXXXXXXX, eth0) may come back on another
// bridge. An element left behind, by a gateway that stopped (its table
// stays, so sandboxes stay bound through a restart) or a notification
// lost, names an interface gone or still on the bridge, never a new one.
//
// A new port's element is committed as soon as its notification is read,
// in a batch of its own (well under a millisecond). Docker enslaves a
// container's veth when it makes the endpoint, before the container's
// task is created; the peer enters the container's namespace in runc's
// prestart hook at the latest, and the sandbox's code runs after that:
// the port is in the set before that code can send, unless the gateway
// gets no CPU for the whole of a container's start. Should it, the frames
// a sandbox sends before its port's element lands are judged by the inet
// table by their source address alone.

// portWatch keeps the bridge table's ports set equal to the bridge's
// ports.
type portWatch struct {
	mu sync.Mutex
	// table is the bridge table once Setup wrote its ports set (nil
	// before: notifications are then ignored, Setup's listing follows).
	table  *nftables.Table
	bridge string
	index  uint32 // the bridge's interface index; 0 while it is missing
	// members is the ports set as the kernel holds it.
	members map[uint32]bool

	// stop closes the notification socket and waits for the goroutine.
	stop func()
}

// link is what the kernel says of one link in a notification or a dump.
type link struct {
	index  uint32
	name   string
	master uint32
	gone   bool // RTM_DELLINK: deleted, or (family AF_BRIDGE) left its bridge
	bridge bool // family AF_BRIDGE: the bridge's own notice about a port
}

// parseLink reads an RTM_NEWLINK or RTM_DELLINK message.
func parseLink(m netlink.Message) (link, bool) {
	t := m.Header.Type
	if (t != unix.RTM_NEWLINK && t != unix.RTM_DELLINK) || len(m.Data) < unix.SizeofIfInfomsg {
		return link{}, false
	}
	// struct ifinfomsg: family, pad, type (2), index (4), flags, change.
	l := link{index: binary.NativeEndian.Uint32(m.Data[4:8]), gone: t == unix.RTM_DELLINK, bridge: m.Data[0] == unix.AF_BRIDGE}
	ad, err := netlink.NewAttributeDecoder(m.Data[unix.SizeofIfInfomsg:])
	if err != nil {
		return link{}, false
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.IFLA_IFNAME:
			l.name = ad.String()
		case unix.IFLA_MASTER:
			l.master = ad.Uint32()
		}
	}
	return l, ad.Err() == nil && l.index != 0
}

// start subscribes to the link notifications and starts the goroutine
// that applies them, unless it runs. It returns once subscribed: a change
// after it is seen.
func (w *portWatch) start(log *zap.Logger) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != nil {
		return nil
	}
	raiseCaps()
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{Groups: unix.RTMGRP_LINK})
	if err != nil {
		return fmt.Errorf("egress firewall: subscribing to link changes (the ports of the sandbox bridge): %w", err)
	}
	// A burst of container starts must not overflow it (a lost
	// notification costs a full listing).
	_ = c.SetReadBuffer(1 << 20)
	var closing atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(c, &closing, log)
	}()
	w.stop = func() {
		closing.Store(true)
		c.Close()
		<-done
	}
	return nil
}

// close stops the goroutine and waits for it; the set stays as it is.
func (w *portWatch) close() {
	w.mu.Lock()
	stop := w.stop
	w.stop = nil
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// run applies each read of notifications in one batch, until c closes.
func (w *portWatch) run(c *netlink.Conn, closing *atomic.Bool, log *zap.Logger) {
	for {
		msgs, err := c.Receive()
		if closing.Load() || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil {
			// ENOBUFS: notifications were lost. List the ports again.
			if err := w.resync(); err != nil {
				log.Warn("egress firewall: listing the sandbox bridge's ports again", zap.Error(err))
			}
			continue
		}
		links := make([]link, 0, len(msgs))
		for _, m := range msgs {
			if l, ok := parseLink(m); ok {
				links = append(links, l)
			}
		}
		if err := w.apply(links); err != nil {
			log.Warn("egress firewall: updating the sandbox bridge's ports", zap.Error(err))
		}
	}
}

// apply brings the set up to date with links, in order; a batch that
// fails (the set changed behind the firewall's back) is followed by a
// full listing.
func (w *portWatch) apply(links []link) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.table == nil || len(links) == 0 {
		return nil
	}
	want := map[uint32]bool{}
	for _, l := range links {
		switch {
		case l.bridge:
		case l.name == w.bridge && l.index != w.index && !l.gone:
			// The bridge made again under its name: its ports are new.
			return w.resyncLocked()
		case l.index == w.index && l.gone:
			w.index = 0 // the bridge deleted; its ports are released
		}
		want[l.index] = !l.gone && w.index != 0 && l.master == w.index
	}
	var add, del []uint32
	for i, in := range want {
		switch {
		case in && !w.members[i]:
			add = append(add, i)
		case !in && w.members[i]:
			del = append(del, i)
		}
	}
	if len(add) == 0 && len(del) == 0 {
		return nil
	}
	if err := w.write(add, del); err != nil {
		return errors.Join(err, w.resyncLocked())
	}
	return nil
}

// write commits add and del to the kernel's set in one batch.
func (w *portWatch) write(add, del []uint32) error {
	c, err := newConn()
	if err != nil {
		return err
	}
	s := portsSet(w.table)
	if len(del) > 0 {
		if err := c.SetDeleteElements(s, indexElements(del)); err != nil {
			return err
		}
	}
	if len(add) > 0 {
		if err := c.SetAddElements(s, indexElements(add)); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("writing the ports of bridge %s: %w", w.bridge, err)
	}
	for _, i := range del {
		delete(w.members, i)
	}
	for _, i := range add {
		w.members[i] = true
	}
	return nil
}

// resync lists the bridge's ports and makes the kernel's set exactly them.
func (w *portWatch) resync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.resyncLocked()
}

func (w *portWatch) resyncLocked() error {
	if w.table == nil {
		return nil
	}
	members, err := w.list(w.bridge)
	if err != nil {
		return err
	}
	c, err := newConn()
	if err != nil {
		return err
	}
	return w.sync(c, w.table, members)
}

// list reads the bridge's index and the indexes of its ports; the caller
// holds w.mu.
func (w *portWatch) list(bridge string) (map[uint32]bool, error) {
	rc, err := newRouteConn()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	msgs, err := rc.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request | netlink.Dump},
		Data:   make([]byte, unix.SizeofIfInfomsg), // AF_UNSPEC: every link
	})
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	links := make([]link, 0, len(msgs))
	w.bridge, w.index = bridge, 0
	for _, m := range msgs {
		if l, ok := parseLink(m); ok {
			links = append(links, l)
			if l.name == bridge {
				w.index = l.index
			}
		}
	}
	members := map[uint32]bool{}
	for _, l := range links {
		if w.index != 0 && l.master == w.index {
			members[l.index] = true
		}
	}
	return members, nil
}

// sync makes the set of table t exactly members, in one batch, writing
// only what differs from what the kernel holds; the caller holds w.mu.
func (w *portWatch) sync(c *nftables.Conn, t *nftables.Table, members map[uint32]bool) error {
	s := portsSet(t)
	els, err := c.GetSetElements(s)
	if err != nil {
		return fmt.Errorf("reading the ports of bridge %s: %w", w.bridge, err)
	}
	held := map[uint32]bool{}
	for _, e := range els {
		if len(e.Key) == 4 {
			held[binary.NativeEndian.Uint32(e.Key)] = true
		}
	}
	var add, del []uint32
	for i := range members {
		if !held[i] {
			add = append(add, i)
		}
	}
	for i := range held {
		if !members[i] {
			del = append(del, i)
		}
	}
	w.table, w.members = t, held
	if len(add) == 0 && len(del) == 0 {
		return nil
	}
	return w.write(add, del)
}

// installed records that table t was installed with members in its set;
// the caller holds w.mu.
func (w *portWatch) installed(t *nftables.Table, members map[uint32]bool) {
	w.table, w.members = t, members
}

// stageEnsure batches, on c, the addition of port (a port of the bridge
// bound now) to the set unless the set holds it; the caller holds w.mu
// until c is flushed, then calls ensured with what this returned.
func (w *portWatch) stageEnsure(c *nftables.Conn, port string) (uint32, error) {
	if w.table == nil {
		return 0, fmt.Errorf("the ports of bridge %s are not listed", w.bridge)
	}
	l, err := linkByName(port)
	if err != nil {
		return 0, err
	}
	if w.index == 0 || l.master != w.index {
		return 0, fmt.Errorf("%s is no port of bridge %s", port, w.bridge)
	}
	if w.members[l.index] {
		return 0, nil
	}
	return l.index, c.SetAddElements(portsSet(w.table), indexElements([]uint32{l.index}))
}

// ensured records what stageEnsure staged, once flushed.
func (w *portWatch) ensured(index uint32) {
	if index != 0 {
		w.members[index] = true
	}
}

// linkByName asks the kernel for one link.
func linkByName(name string) (link, error) {
	rc, err := newRouteConn()
	if err != nil {
		return link{}, err
	}
	defer rc.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.IFLA_IFNAME, name)
	attrs, err := ae.Encode()
	if err != nil {
		return link{}, err
	}
	msgs, err := rc.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request},
		Data:   append(make([]byte, unix.SizeofIfInfomsg), attrs...),
	})
	if err != nil {
		return link{}, fmt.Errorf("reading link %s: %w", name, err)
	}
	for _, m := range msgs {
		if l, ok := parseLink(m); ok {
			return l, nil
		}
	}
	return link{}, fmt.Errorf("reading link %s: no answer", name)
}

// portsSet is the ports set of bridge table t.
func portsSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: setPorts, KeyType: nftables.TypeIFIndex, KeyByteOrder: binaryutil.NativeEndian}
}

// indexElements are set elements keyed by interface index, in the host's
// byte order (as "meta iif" loads it).
func indexElements(idx []uint32) []nftables.SetElement {
	slices.Sort(idx)
	els := make([]nftables.SetElement, 0, len(idx))
	for _, i := range idx {
		els = append(els, nftables.SetElement{Key: binary.NativeEndian.AppendUint32(nil, i)})
	}
	return els
}
