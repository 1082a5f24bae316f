package egress

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file keeps a sandbox from speaking as another on the sandbox
// bridge. The inet table judges packets by source address alone, so a
// sandbox given NET_RAW could send with another's address (and leave under
// its policy) or answer ARP for it (and receive its traffic). A table of
// the bridge family, which sees frames as they enter a bridge from a port,
// ties each running sandbox's address to its port (the host end of its
// veth) and its MAC:
//
//	table bridge sandwake-<br> {
//	  set ports    { type iface_index }                       # every port of <br>, bound or not (ports_watch.go)
//	  set bound    { type ifname . ether_addr . ipv4_addr }
//	  set portmacs { type ifname . ether_addr }
//	  chain prerouting { type filter hook prerouting priority -300;
//	    iif @ports ip:  iifname . ether saddr . ip saddr != @bound drop
//	    iif @ports arp: iifname . arp saddr ether . arp saddr ip != @bound drop
//	    iif @ports iifname . ether saddr != @portmacs drop
//	  }
//	}
//
// (each drop counted in the counter "spoofed"). A port of the bridge that
// no running sandbox is bound to speaks for nobody: its frames are all
// dropped, so a sandbox's own frames pass only once its start bound it,
// and a port that joined the bridge since cannot claim an address either.
//
// The hook sees the frames of every bridge of the host, and this kernel
// has no "meta ibrname" to ask which bridge a frame entered: every rule
// starts with "iif @ports", which holds only the ports of sandwake's
// bridge, so no rule touches a frame of another bridge, whatever its
// addresses (a Docker network, a plain bridge, CNI or libvirt on a subnet
// that overlaps the sandbox network's), while the gateway runs or after it
// stopped. The drops happen before the bridge learns the frame's source
// MAC, so a borrowed MAC does not move another sandbox's entry in its
// forwarding table either.

// Names inside the bridge table.
const (
	setBound       = "bound"
	setPorts       = "ports"
	setPortMACs    = "portmacs"
	counterSpoofed = "spoofed"
)

// bridgeLayout marks the chain's first rule with the table's layout: a
// table an older gateway wrote (its rules not scoped to the bridge's
// ports) is installed again, its bindings kept.
const bridgeLayout = "sandwake-bridge/ports-v2"

// Offsets in the frames the bridge table reads.
const (
	offEtherSrc  = 6  // link header: source MAC
	offEtherType = 12 // link header: EtherType
	offARPSha    = 8  // ARP: sender hardware address
	offARPSpa    = 14 // ARP: sender protocol address
)

// Registers of a concatenation: the interface name fills NFT_REG_1, a MAC
// the first 8 bytes of NFT_REG_2, an IPv4 address the 32-bit register
// after it (as nft lays out "iifname . ether saddr . ip saddr").
const (
	regName = 1
	regMAC  = 2
	regAddr = 14
)

var (
	typeBound    = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeEtherAddr, nftables.TypeIPAddr)
	typePortMACs = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeEtherAddr)
)

// binding is what an address is bound to.
type binding struct {
	port string
	mac  net.HardwareAddr
}

func (f *Firewall) bridgeSets() (bound, portmacs *nftables.Set) {
	t := f.btable
	return &nftables.Set{Table: t, Name: setBound, KeyType: typeBound, Concatenation: true},
		&nftables.Set{Table: t, Name: setPortMACs, KeyType: typePortMACs, Concatenation: true}
}

// etherType: ether type <t>.
func etherType(t uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: offEtherType, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{byte(t >> 8), byte(t)}},
	}
}

// inSet: <what in reg1> @set, or != @set when invert.
func inSet(set string, invert bool) expr.Any {
	return &expr.Lookup{SourceRegister: reg1, SetName: set, Invert: invert}
}

// iifInPorts: iif @ports.
func iifInPorts() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIF, Register: reg1}, inSet(setPorts, false)}
}

// notBound: iifname . <mac at macOff of base> [. <addr at addrOff of the
// network header>] != @set.
func notBound(set string, macBase expr.PayloadBase, macOff uint32, addrOff int) []expr.Any {
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regName},
		&expr.Payload{DestRegister: regMAC, Base: macBase, Offset: macOff, Len: 6},
	}
	if addrOff >= 0 {
		out = append(out, &expr.Payload{DestRegister: regAddr, Base: expr.PayloadBaseNetworkHeader, Offset: uint32(addrOff), Len: 4})
	}
	return append(out, inSet(set, true))
}

func spoofDrop() []expr.Any {
	return []expr.Any{counterRef(counterSpoofed), verdict(expr.VerdictDrop)}
}

// installBridge (re)creates the bridge table in one batch, its ports set
// holding ports (the bridge's, listed under f.ports.mu) and its bindings
// carry (none when nil).
func (f *Firewall) installBridge(c *nftables.Conn, ports map[uint32]bool, carry map[netip.Addr]binding) error {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyBridge)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == f.btable.Name }) {
		c.DelTable(f.btable)
	}
	t := c.AddTable(f.btable)
	bound, portmacs := f.bridgeSets()
	var boundEls, macEls []nftables.SetElement
	macs := map[string]bool{}
	for a, b := range carry {
		boundEls = append(boundEls, nftables.SetElement{Key: boundKey(b, a)})
		if k := portMACKey(b); !macs[string(k)] {
			macs[string(k)] = true
			macEls = append(macEls, nftables.SetElement{Key: k})
		}
	}
	for _, s := range []struct {
		set *nftables.Set
		els []nftables.SetElement
	}{{portsSet(t), indexElements(slices.Collect(maps.Keys(ports)))}, {bound, boundEls}, {portmacs, macEls}} {
		if err := c.AddSet(s.set, s.els); err != nil {
			return err
		}
	}
	c.AddObj(&nftables.CounterObj{Table: t, Name: counterSpoofed})
	pre := c.AddChain(&nftables.Chain{Table: t, Name: chainPrerouting, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-300)})
	rules := [][]expr.Any{
		cat(iifInPorts(), etherType(unix.ETH_P_IP), notBound(setBound, expr.PayloadBaseLLHeader, offEtherSrc, offSaddr), spoofDrop()),
		cat(iifInPorts(), etherType(unix.ETH_P_ARP), notBound(setBound, expr.PayloadBaseNetworkHeader, offARPSha, offARPSpa), spoofDrop()),
		cat(iifInPorts(), notBound(setPortMACs, expr.PayloadBaseLLHeader, offEtherSrc, -1), spoofDrop()),
	}
	for i, r := range rules {
		rule := &nftables.Rule{Table: t, Chain: pre, Exprs: r}
		if i == 0 {
			rule.UserData = []byte(bridgeLayout)
		}
		c.AddRule(rule)
	}
	f.bindings = maps.Clone(carry)
	if f.bindings == nil {
		f.bindings = map[netip.Addr]binding{}
	}
	return nil
}

// bridgeComplete reports whether the bridge table exists with its chain
// and sets, and whether its rules are of this layout (bridgeLayout).
func (f *Firewall) bridgeComplete(c *nftables.Conn) (complete, current bool, err error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyBridge)
	if err != nil {
		return false, false, err
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == f.btable.Name }) {
		return false, false, nil
	}
	sets, err := c.GetSets(f.btable)
	if err != nil {
		return false, false, err
	}
	for _, want := range []string{setBound, setPorts, setPortMACs} {
		if !slices.ContainsFunc(sets, func(s *nftables.Set) bool { return s.Name == want }) {
			return false, false, nil
		}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyBridge)
	if err != nil {
		return false, false, err
	}
	i := slices.IndexFunc(chains, func(ch *nftables.Chain) bool {
		return ch.Table != nil && ch.Table.Name == f.btable.Name && ch.Name == chainPrerouting
	})
	if i < 0 {
		return false, false, nil
	}
	rules, err := c.GetRules(f.btable, chains[i])
	if err != nil {
		return false, false, err
	}
	return true, len(rules) == 3 && string(rules[0].UserData) == bridgeLayout, nil
}

// loadBindings reads the bindings the kernel holds (after a restart of
// the gateway).
func (f *Firewall) loadBindings(c *nftables.Conn) error {
	bound, _ := f.bridgeSets()
	els, err := c.GetSetElements(bound)
	if err != nil {
		return fmt.Errorf("egress firewall: reading the port bindings: %w", err)
	}
	f.bindings = map[netip.Addr]binding{}
	for _, e := range els {
		if len(e.Key) != 28 {
			continue
		}
		port := string(e.Key[:unix.IFNAMSIZ])
		if i := slices.Index([]byte(port), 0); i >= 0 {
			port = port[:i]
		}
		addr := netip.AddrFrom4([4]byte(e.Key[24:28]))
		f.bindings[addr] = binding{port: port, mac: net.HardwareAddr(slices.Clone(e.Key[16:22]))}
	}
	return nil
}

func boundKey(b binding, addr netip.Addr) []byte {
	k := make([]byte, 0, 28)
	k = append(k, ifname(b.port)...)
	k = append(k, b.mac...)
	k = append(k, 0, 0)
	a := addr.As4()
	return append(k, a[:]...)
}

func portMACKey(b binding) []byte {
	k := append(ifname(b.port), b.mac...)
	return append(k, 0, 0)
}

// runningSet is the inet table's set of bound addresses (firewall.go's
// output chain).
func (f *Firewall) runningSet() *nftables.Set {
	return &nftables.Set{Table: f.table, Name: setRunning, KeyType: nftables.TypeIPAddr}
}

// runningElements are the bound addresses, as the running set holds them.
func (f *Firewall) runningElements() []nftables.SetElement {
	els := make([]nftables.SetElement, 0, len(f.bindings))
	for a := range f.bindings {
		k := a.As4()
		els = append(els, nftables.SetElement{Key: k[:]})
	}
	return els
}

// stageUnbind batches the removal of addr's binding. Its port stays in
// the ports set while it is the bridge's: a port bound to nothing speaks
// for nothing.
func (f *Firewall) stageUnbind(c *nftables.Conn, addr netip.Addr) error {
	b, ok := f.bindings[addr]
	if !ok {
		return nil
	}
	bound, portmacs := f.bridgeSets()
	a := addr.As4()
	for _, d := range []struct {
		s   *nftables.Set
		key []byte
	}{{bound, boundKey(b, addr)}, {portmacs, portMACKey(b)}, {f.runningSet(), a[:]}} {
		if err := c.SetDeleteElements(d.s, []nftables.SetElement{{Key: d.key}}); err != nil {
			return err
		}
	}
	return nil
}

// Bind implements lifecycle.Firewall.
func (f *Firewall) Bind(pb lifecycle.PortBinding) error {
	mac, err := net.ParseMAC(pb.MAC)
	if err != nil || len(mac) != 6 {
		return fmt.Errorf("egress firewall: binding sandbox %s: the engine gave no usable MAC (%q)", pb.ID, pb.MAC)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.btable == nil {
		return fmt.Errorf("%w: the firewall is not set up", lifecycle.ErrEgressUnenforced)
	}
	port, err := bridgePort(f.net.Bridge, pb.Pid)
	if err != nil {
		return fmt.Errorf("egress firewall: binding sandbox %s: %w", pb.ID, err)
	}
	want := binding{port: port, mac: mac}
	if old, ok := f.bindings[pb.Address]; ok && old.port == want.port && slices.Equal(old.mac, want.mac) {
		return nil
	}
	c, err := newConn()
	if err != nil {
		return f.privilege(err)
	}
	// What the address held before, and any stale binding of the same
	// port or MAC (a sandbox whose stop was not seen), go in the same
	// batch: elements are shared by key.
	for a, b := range f.bindings {
		if a == pb.Address || b.port == port || slices.Equal(b.mac, mac) {
			if err := f.stageUnbind(c, a); err != nil {
				return err
			}
		}
	}
	bound, portmacs := f.bridgeSets()
	a := pb.Address.As4()
	for _, d := range []struct {
		s   *nftables.Set
		key []byte
	}{{bound, boundKey(want, pb.Address)}, {portmacs, portMACKey(want)}, {f.runningSet(), a[:]}} {
		if err := c.SetAddElements(d.s, []nftables.SetElement{{Key: d.key}}); err != nil {
			return err
		}
	}
	// The port is in the ports set since it joined the bridge (the
	// watcher's notification); ensured again here, in the same batch,
	// under the watcher's lock so that a notification read meanwhile is
	// applied after.
	f.ports.mu.Lock()
	defer f.ports.mu.Unlock()
	ensured, err := f.ports.stageEnsure(c, port)
	if err != nil {
		return fmt.Errorf("egress firewall: binding sandbox %s: %w", pb.ID, err)
	}
	if err := c.Flush(); err != nil {
		// A stale view (the table changed by hand): read it again; the
		// next reconcile binds what is missing.
		if lc, lerr := newConn(); lerr == nil {
			f.loadBindings(lc)
		}
		return fmt.Errorf("egress firewall: binding sandbox %s: %w", pb.ID, err)
	}
	f.ports.ensured(ensured)
	for a, b := range f.bindings {
		if a == pb.Address || b.port == port || slices.Equal(b.mac, mac) {
			delete(f.bindings, a)
		}
	}
	f.bindings[pb.Address] = want
	return nil
}

// Unbind implements lifecycle.Firewall.
func (f *Firewall) Unbind(addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.btable == nil {
		return nil
	}
	if _, ok := f.bindings[addr]; !ok {
		return nil
	}
	c, err := newConn()
	if err != nil {
		return err
	}
	if err := f.stageUnbind(c, addr); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress firewall: unbinding %s: %w", addr, err)
	}
	delete(f.bindings, addr)
	return nil
}

// Bound implements lifecycle.Firewall: the bindings whose port is still
// one of the bridge's.
func (f *Firewall) Bound() (map[netip.Addr]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[netip.Addr]bool{}
	if f.btable == nil {
		return out, nil
	}
	br, err := net.InterfaceByName(f.net.Bridge)
	if err != nil {
		return nil, fmt.Errorf("egress firewall: finding bridge %s: %w", f.net.Bridge, err)
	}
	c, err := newRouteConn()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ports, err := bridgePorts(c, br.Index)
	if err != nil {
		return nil, err
	}
	live := make(map[string]bool, len(ports))
	for _, p := range ports {
		live[p.name] = true
	}
	for a, b := range f.bindings {
		if live[b.port] {
			out[a] = true
		}
	}
	return out, nil
}

// Spoofed is how many frames the bridge table dropped for speaking with an
// address, MAC or port not bound together.
func (f *Firewall) Spoofed() (uint64, error) {
	f.mu.Lock()
	t := f.btable
	f.mu.Unlock()
	if t == nil {
		return 0, nil
	}
	c, err := newConn()
	if err != nil {
		return 0, err
	}
	objs, err := c.GetObjects(t)
	if err != nil {
		return 0, fmt.Errorf("egress firewall: reading the spoofed counter: %w", err)
	}
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok && co.Name == counterSpoofed {
			return co.Packets, nil
		}
	}
	return 0, nil
}
