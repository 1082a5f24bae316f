package egress

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/sandwake/sandwake/lifecycle"
)

// Names inside the table.
const (
	setDenied       = "denied"
	mapSandboxes    = "sandboxes"
	chainFrom       = "from_sandbox"
	chainForward    = "forward"
	chainInput      = "input"
	chainPrerouting = "prerouting"
	chainOutput     = "output"
	// setRunning holds the addresses bound to a running sandbox's port
	// (bindings.go): the host's own connections reach only those.
	setRunning = "running"
	// chainAllowed and chainRefused end every sandbox chain's verdicts,
	// logging what the egress log reads (verdictChains).
	chainAllowed = "allowed"
	chainRefused = "refused"
	// Counters of the drops not charged to a sandbox.
	counterUnknown  = "unknown_source"
	counterInbound  = "inbound"
	counterLoopback = "loopback"
	sandboxPrefix   = "sb-"
)

// TableName is the nftables table (family inet) of the sandbox network
// whose bridge is bridge.
func TableName(bridge string) string { return "sandwake-" + bridge }

// Options configure a Firewall.
type Options struct {
	// Deny are ranges a public policy denies beyond lifecycle's fixed list
	// and the host's own addresses (egress_deny).
	Deny []netip.Prefix
	// Resolvers are the DNS servers the forwarder asks (egress_dns).
	// Sandboxes do not reach them (but containers made before the
	// forwarder, under public and learn, until they are made again).
	// Default: the nameservers of the host's resolv.conf.
	Resolvers []netip.Addr
	// AllowPrivate are the denied destinations an allow entry may open
	// (egress_allow_private): an allowed name's answer in a denied range
	// enters its sandbox's set only where one of these opens it on every
	// port and protocol the name rule does.
	AllowPrivate []lifecycle.AllowRule
	// MinTTL and MaxTTL bound how long an answer's addresses stay in the
	// sandbox's set (its TTL, clamped); a packet sent to one keeps it
	// MaxTTL more. Defaults: DefaultMinTTL, DefaultMaxTTL.
	MinTTL, MaxTTL time.Duration
	// Logger receives what the firewall repairs. Default: none.
	Logger *zap.Logger
}

// Defaults of Options.
const (
	DefaultMinTTL = time.Minute
	DefaultMaxTTL = 30 * time.Minute
)

// Firewall is a lifecycle.Firewall on nftables. Methods are safe for
// concurrent use; each change is one netlink batch, applied atomically.
type Firewall struct {
	opts Options
	log  *zap.Logger

	mu       sync.Mutex
	net      lifecycle.SandboxNet
	table    *nftables.Table
	denied   []netip.Prefix
	resolver []netip.Addr
	repaired bool
	// What the kernel holds, as this firewall last wrote or read it:
	// the map's addresses (to the chain each jumps to), the sandbox chains,
	// and the policy each chain holds.
	elems    map[netip.Addr]string
	chains   map[string]string // chain -> policy key ("" when unknown)
	counters map[string]bool   // the sandboxes' named counters
	// btable is the bridge table of the port bindings (bindings.go), and
	// bindings what its sets hold, by address.
	btable   *nftables.Table
	bindings map[netip.Addr]binding
	// ports keeps the bridge table's set of the bridge's ports
	// (ports_watch.go); its lock comes after f.mu.
	ports portWatch
	// sets are the name sets the kernel holds (names.go), by the
	// sandbox they belong to: a sync touches one sandbox's, not all.
	sets setIndex
	// group is the table's log group (nflog.go); fwd the DNS forwarder
	// (forwarder.go) and stopLog the stop of the log reader and of the
	// denial sweep beside it (denials.go), once started.
	group   uint16
	fwd     *forwarder
	fwdAddr netip.Addr
	stopLog func()
	// closed is set by Close: a Setup after it (one racing it) starts
	// nothing, so no service outlives Close.
	closed bool
	// timeoutUpdates: the kernel renews an element's expiry when it is
	// added again with another timeout (probed at Setup).
	timeoutUpdates bool
	probed         bool

	// Read by the forwarder and the log reader without f.mu (which
	// Close holds while they stop): the table, the upstream resolvers
	// and the denied ranges, and each sandbox's state by id and address.
	tableRef  atomic.Pointer[nftables.Table]
	upstream  atomic.Pointer[[]netip.Addr]
	deniedRef atomic.Pointer[[]netip.Prefix]
	smu       sync.RWMutex
	byID      map[string]*sandbox
	byAddr    map[netip.Addr]*sandbox
	onDenied  atomic.Pointer[func(lifecycle.Event) bool]
	conns     connTable
	// denials bounds what onDenied is told (denials.go).
	denials *denialLimiter
}

// New returns a firewall; nothing is installed until Setup.
func New(opts Options) *Firewall {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Firewall{opts: opts, log: log, byID: map[string]*sandbox{}, byAddr: map[netip.Addr]*sandbox{}, sets: setIndex{},
		denials: newDenialLimiter(time.Now, DeniedPerWindow)}
}

func (f *Firewall) upstreams() []netip.Addr {
	if p := f.upstream.Load(); p != nil {
		return *p
	}
	return nil
}

func (f *Firewall) ttlBounds() (lo, hi time.Duration) {
	lo, hi = f.opts.MinTTL, f.opts.MaxTTL
	if lo <= 0 {
		lo = DefaultMinTTL
	}
	if hi <= 0 {
		hi = DefaultMaxTTL
	}
	return lo, max(lo, hi)
}

// opensPrivate reports whether an answer address a may enter a set of
// name rule r: outside the denied ranges always, inside only where
// egress_allow_private opens it.
func (f *Firewall) opensPrivate(a netip.Addr, r lifecycle.AllowRule) bool {
	if p := f.deniedRef.Load(); p != nil {
		for _, d := range *p {
			if d.Contains(a) {
				return privateOpened(f.opts.AllowPrivate, a, r)
			}
		}
	}
	return true
}

// privateOpened reports whether the operator's egress_allow_private
// entries open addr on every port and protocol an answer to a name rule r
// may be used for: the forwarder puts a private answer into a set only
// then.
func privateOpened(allowPrivate []lifecycle.AllowRule, addr netip.Addr, r lifecycle.AllowRule) bool {
	for _, p := range protos(r) {
		if !slices.ContainsFunc(allowPrivate, func(a lifecycle.AllowRule) bool {
			return a.Prefix.Contains(addr) && a.Proto == p && (a.Port == 0 || a.Port == r.Port)
		}) {
			return false
		}
	}
	return true
}

// Close stops the forwarder, the log reader and the watch of the bridge's
// ports; the kernel's rules stay (sandboxes keep their policies and
// bindings while the gateway restarts). A Setup after it (or racing it)
// fails: a restarted gateway makes a new Firewall.
func (f *Firewall) Close() error {
	f.mu.Lock()
	fwd, stop := f.fwd, f.stopLog
	f.fwd, f.stopLog = nil, nil
	f.closed = true
	f.mu.Unlock()
	if fwd != nil {
		fwd.stop()
	}
	if stop != nil {
		stop()
	}
	f.ports.close()
	return nil
}

// errFirewallClosed answers a Setup after Close.
var errFirewallClosed = errors.New("egress firewall: closed")

// Setup implements lifecycle.Firewall: it checks that the sandbox bridge
// is in this network namespace (the engine is local) and installs the
// table, or checks and refreshes an installed one.
func (f *Firewall) Setup(ctx context.Context, n lifecycle.SandboxNet) error {
	if _, err := net.InterfaceByName(n.Bridge); err != nil {
		return fmt.Errorf("%w: the sandbox network's bridge %s is not in this gateway's network namespace, so its firewall cannot be installed here: "+
			"the Docker engine runs on another host (a remote DOCKER_HOST, Docker Desktop's VM) or the gateway runs in a container without the host's network. "+
			"Run the gateway on the engine's host (network_mode: host, CAP_NET_ADMIN), or write `egress unenforced` in the sandwake block to run sandboxes without egress policy",
			lifecycle.ErrEgressUnenforced, n.Bridge)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errFirewallClosed
	}
	if f.net.Bridge != "" && f.net.Bridge != n.Bridge {
		f.elems, f.chains = nil, nil // a new network: nothing of the old table applies
	}
	f.net = n
	f.table = &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(n.Bridge)}
	f.tableRef.Store(f.table)
	f.group = logGroup(n.Bridge)
	f.resolver = f.opts.Resolvers
	if f.resolver == nil {
		f.resolver = HostResolvers()
	}
	up := slices.Clone(f.resolver)
	f.upstream.Store(&up)
	f.denied = slices.Concat(lifecycle.EgressDeniedRanges, f.opts.Deny, HostAddresses(), []netip.Prefix{n.Subnet})
	denied := slices.Clone(f.denied)
	f.deniedRef.Store(&denied)
	f.conns.setNet(n.Subnet, n.Gateway)
	raiseCaps()
	if err := f.startServices(n); err != nil {
		return err
	}
	if !f.probed {
		f.timeoutUpdates, f.probed = probeTimeoutUpdates(), true
	}

	c, err := newConn()
	if err != nil {
		return f.privilege(err)
	}
	// Tables of networks removed since (cleanup.go); this bridge exists.
	if _, err := f.removeStale(); err != nil {
		f.log.Warn("removing the firewall tables of sandbox networks that are gone", zap.Error(err))
	}
	if err := f.setupBridge(c, n); err != nil {
		return err
	}
	complete, err := f.complete(c)
	if err != nil {
		return f.privilege(err)
	}
	if !complete {
		if f.elems != nil || f.chains != nil {
			f.repaired = true
			f.log.Warn("egress firewall table missing or incomplete: installing it again", zap.String("table", f.table.Name))
		}
		if err := f.install(c); err != nil {
			return f.privilege(err)
		}
		f.elems, f.chains, f.counters, f.sets = map[netip.Addr]string{}, map[string]string{}, map[string]bool{}, setIndex{}
		return nil
	}
	// Installed: the host's addresses may have changed since, and the
	// running set follows the bindings (a binding table installed again
	// holds none).
	set := &nftables.Set{Table: f.table, Name: setDenied, KeyType: nftables.TypeIPAddr, Interval: true}
	c.FlushSet(set)
	if err := c.SetAddElements(set, intervalElements(mergeSpans(f.denied))); err != nil {
		return fmt.Errorf("egress firewall: %w", err)
	}
	running := f.runningSet()
	c.FlushSet(running)
	if err := c.SetAddElements(running, f.runningElements()); err != nil {
		return fmt.Errorf("egress firewall: %w", err)
	}
	if err := f.stageLoopbackRule(c); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return f.privilege(err)
	}
	if f.elems == nil {
		return f.load(c)
	}
	return nil
}

// probeTimeoutUpdates reports whether this kernel renews a set element's
// timeout when the element is added again with another (Linux 6.x does;
// older kernels keep the first, and the forwarder then deletes and adds
// an element it renews, at a cost of milliseconds per commit). The probe
// uses a table of its own, removed after, named apart from any other
// gateway's probe (gateways in containers of their own are each pid 1).
func probeTimeoutUpdates() bool {
	c, err := newConn()
	if err != nil {
		return false
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: fmt.Sprintf("sandwake-probe-%d-%08x", os.Getpid(), rand.Uint32())})
	defer func() {
		c.DelTable(t)
		c.Flush()
	}()
	s := &nftables.Set{Table: t, Name: "probe", KeyType: nftables.TypeIPAddr, HasTimeout: true}
	if c.AddSet(s, nil) != nil {
		return false
	}
	key := []byte{192, 0, 2, 1}
	for _, to := range []time.Duration{10 * time.Second, 20 * time.Second} {
		if c.SetAddElements(s, []nftables.SetElement{{Key: key, Timeout: to}}) != nil || c.Flush() != nil {
			return false
		}
	}
	els, err := c.GetSetElements(s)
	return err == nil && len(els) == 1 && els[0].Timeout == 20*time.Second
}

// startServices starts the forwarder on the network's gateway, the log
// reader and the watch of the bridge's ports, unless they run (for this
// network).
func (f *Firewall) startServices(n lifecycle.SandboxNet) error {
	// Subscribed before setupBridge lists the ports: no change is missed.
	if err := f.ports.start(f.log); err != nil {
		return err
	}
	if f.fwd != nil && f.fwdAddr != n.Gateway {
		f.fwd.stop()
		f.fwd = nil
	}
	if f.fwd == nil {
		fwd, err := f.startForwarder(n.Gateway)
		if err != nil {
			return err
		}
		f.fwd, f.fwdAddr = fwd, n.Gateway
	}
	if f.stopLog == nil {
		if err := f.startLog(f.group); err != nil {
			// The policies hold without it; only the log is blind.
			f.log.Warn("egress log unavailable: sandboxes' connections are enforced but not logged", zap.Error(err))
		}
	}
	return nil
}

// setupBridge installs the bridge table of the port bindings, or checks
// an installed one (reading its bindings after a restart).
func (f *Firewall) setupBridge(c *nftables.Conn, n lifecycle.SandboxNet) error {
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: TableName(n.Bridge)}
	if f.btable == nil || f.btable.Name != t.Name {
		f.bindings = nil
	}
	f.btable = t
	// The ports are listed and written under the watcher's lock: a
	// notification it reads meanwhile is applied after, on top.
	f.ports.mu.Lock()
	defer f.ports.mu.Unlock()
	ports, err := f.ports.list(n.Bridge)
	if err != nil {
		return fmt.Errorf("egress firewall: listing the ports of bridge %s: %w", n.Bridge, err)
	}
	complete, current, err := f.bridgeComplete(c)
	if err != nil {
		return f.privilege(err)
	}
	if complete && f.bindings == nil {
		if err := f.loadBindings(c); err != nil {
			return err
		}
	}
	if complete && current {
		if err := f.ports.sync(c, t, ports); err != nil {
			return f.privilege(err)
		}
		return nil
	}
	var carry map[netip.Addr]binding
	switch {
	case complete:
		// An older gateway's layout: written again, its bindings kept
		// (the sandboxes run).
		carry = f.bindings
	case f.bindings != nil:
		f.repaired = true
		f.log.Warn("port binding table missing or incomplete: installing it again", zap.String("table", t.Name))
	}
	if err := f.installBridge(c, ports, carry); err != nil {
		return f.privilege(err)
	}
	if err := c.Flush(); err != nil {
		return f.privilege(err)
	}
	f.ports.installed(t, ports)
	return nil
}

// privilege explains a netlink refusal: without CAP_NET_ADMIN the kernel
// answers EPERM.
func (f *Firewall) privilege(err error) error {
	if errors.Is(err, syscall.EPERM) || errors.Is(err, os.ErrPermission) || strings.Contains(err.Error(), "operation not permitted") {
		return fmt.Errorf("%w: installing the nftables table %s was refused (%v): the gateway needs CAP_NET_ADMIN in the engine host's network namespace "+
			"(run it as root, or with AmbientCapabilities=CAP_NET_ADMIN under systemd, or cap_add: [NET_ADMIN] and network_mode: host in compose), "+
			"or write `egress unenforced` in the sandwake block to run sandboxes without egress policy",
			lifecycle.ErrEgressUnenforced, f.table.Name, raiseFailed(err))
	}
	return fmt.Errorf("egress firewall (table %s): %w", f.table.Name, err)
}

// complete reports whether the table exists with every base part.
func (f *Firewall) complete(c *nftables.Conn) (bool, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == f.table.Name }) {
		return false, nil
	}
	chains, err := f.tableChains(c)
	if err != nil {
		return false, err
	}
	for _, want := range []string{chainFrom, chainForward, chainInput, chainPrerouting, chainOutput, chainAllowed, chainRefused} {
		if !slices.ContainsFunc(chains, func(ch *nftables.Chain) bool { return ch.Name == want }) {
			return false, nil
		}
	}
	sets, err := c.GetSets(f.table)
	if err != nil {
		return false, err
	}
	for _, want := range []string{setDenied, mapSandboxes, setRunning} {
		if !slices.ContainsFunc(sets, func(s *nftables.Set) bool { return s.Name == want }) {
			return false, nil
		}
	}
	return true, nil
}

func (f *Firewall) tableChains(c *nftables.Conn) ([]*nftables.Chain, error) {
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(ch *nftables.Chain) bool { return ch.Table == nil || ch.Table.Name != f.table.Name }), nil
}

// install (re)creates the whole table in one batch: an incomplete one is
// deleted first, so no half-table is ever in force.
func (f *Firewall) install(c *nftables.Conn) error {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == f.table.Name }) {
		c.DelTable(f.table)
	}
	t := c.AddTable(f.table)
	denied := &nftables.Set{Table: t, Name: setDenied, KeyType: nftables.TypeIPAddr, Interval: true}
	if err := c.AddSet(denied, intervalElements(mergeSpans(f.denied))); err != nil {
		return err
	}
	vmap := &nftables.Set{Table: t, Name: mapSandboxes, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict, IsMap: true}
	if err := c.AddSet(vmap, nil); err != nil {
		return err
	}
	for _, name := range []string{counterUnknown, counterInbound, counterLoopback} {
		c.AddObj(&nftables.CounterObj{Table: t, Name: name})
	}
	for _, name := range []string{chainAllowed, chainRefused} {
		ch := c.AddChain(&nftables.Chain{Table: t, Name: name})
		for _, r := range verdictChains(f.group)[name] {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
		}
	}
	br := f.net.Bridge
	from := c.AddChain(&nftables.Chain{Table: t, Name: chainFrom})
	rules := [][]expr.Any{
		cat(ctDirection(dirReply), []expr.Any{verdict(expr.VerdictAccept)}),
		cat(nfproto(unix.NFPROTO_IPV6), []expr.Any{verdict(expr.VerdictDrop)}),
		{
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: offSaddr, Len: 4},
			&expr.Lookup{SourceRegister: reg1, SetName: mapSandboxes, IsDestRegSet: true, DestRegister: regVerdict},
		},
		{counterRef(counterUnknown), verdict(expr.VerdictDrop)},
	}
	for _, r := range rules {
		c.AddRule(&nftables.Rule{Table: t, Chain: from, Exprs: r})
	}
	prio := nftables.ChainPriorityRef(-10)
	fwd := c.AddChain(&nftables.Chain{Table: t, Name: chainForward, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: prio})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(matchIf(expr.MetaKeyIIFNAME, br, expr.CmpOpEq), []expr.Any{jump(chainFrom)})})
	// New connections routed into the bridge from outside the host
	// (moby#41872): previews come only through the gateway.
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		matchIf(expr.MetaKeyOIFNAME, br, expr.CmpOpEq), matchIf(expr.MetaKeyIIFNAME, br, expr.CmpOpNeq),
		ctDirection(dirOriginal), ctNew(), []expr.Any{counterRef(counterInbound), verdict(expr.VerdictDrop)})})
	in := c.AddChain(&nftables.Chain{Table: t, Name: chainInput, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: prio})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(matchIf(expr.MetaKeyIIFNAME, br, expr.CmpOpEq), []expr.Any{jump(chainFrom)})})
	// The forwarder knows its asker by source address: port 53 of the
	// gateway hears only the bridge, where the bindings make that address
	// true (forwarder.go checks the arrival interface as well).
	for _, p := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(matchIf(expr.MetaKeyIIFNAME, br, expr.CmpOpNeq), nfproto(unix.NFPROTO_IPV4),
			ipPrefix(offDaddr, netip.PrefixFrom(f.net.Gateway, 32)), l4proto(p), dport(portDNS),
			[]expr.Any{&expr.Counter{}, verdict(expr.VerdictDrop)})})
	}
	// The host's own connections to an address of the subnet that no
	// running sandbox holds (stopped, or gone behind sandwake's back) are
	// refused at once, not left to time out on ARP: the gateway's dial
	// fails fast and the request is held through a wake.
	if err := c.AddSet(&nftables.Set{Table: t, Name: setRunning, KeyType: nftables.TypeIPAddr}, f.runningElements()); err != nil {
		return err
	}
	out := c.AddChain(&nftables.Chain{Table: t, Name: chainOutput, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput, Priority: prio})
	notRunning := cat(matchIf(expr.MetaKeyOIFNAME, br, expr.CmpOpEq), nfproto(unix.NFPROTO_IPV4), ipPrefix(offDaddr, f.net.Subnet),
		[]expr.Any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: offDaddr, Len: 4}, &expr.Lookup{SourceRegister: reg1, SetName: setRunning, Invert: true}})
	gw := f.net.Gateway.As4()
	notGateway := []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: offDaddr, Len: 4},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: gw[:]},
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: cat(notRunning, notGateway, l4proto(unix.IPPROTO_TCP), []expr.Any{rejectTCP()})})
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: cat(notRunning, notGateway, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_HOST_UNREACH}})})
	pre := c.AddChain(&nftables.Chain{Table: t, Name: chainPrerouting, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle})
	c.AddRule(f.loopbackRule(pre))
	return c.Flush()
}

// loopbackLayout marks the prerouting rule scoped to the bridge: an older
// gateway's, which dropped such packets on every interface, is replaced.
const loopbackLayout = "loopback/bridge-v2"

// loopbackRule drops packets for 127.0.0.0/8 coming from the sandbox
// bridge: a sandbox reaching ports published on the host's 127.0.0.1
// (moby#45610), before DNAT (priority -100) rewrites them. Only the
// bridge's: another interface's traffic is not sandwake's to judge.
func (f *Firewall) loopbackRule(pre *nftables.Chain) *nftables.Rule {
	return &nftables.Rule{Table: pre.Table, Chain: pre, UserData: []byte(loopbackLayout), Exprs: cat(
		matchIf(expr.MetaKeyIIFNAME, f.net.Bridge, expr.CmpOpEq), nfproto(unix.NFPROTO_IPV4),
		ipPrefix(offDaddr, netip.MustParsePrefix("127.0.0.0/8")), []expr.Any{counterRef(counterLoopback), verdict(expr.VerdictDrop)})}
}

// stageLoopbackRule batches the replacement of an installed table's
// prerouting rule unless it is loopbackRule.
func (f *Firewall) stageLoopbackRule(c *nftables.Conn) error {
	pre := &nftables.Chain{Table: f.table, Name: chainPrerouting}
	rules, err := c.GetRules(f.table, pre)
	if err != nil {
		return fmt.Errorf("egress firewall: reading the prerouting chain: %w", err)
	}
	if len(rules) == 1 && string(rules[0].UserData) == loopbackLayout {
		return nil
	}
	c.FlushChain(pre)
	c.AddRule(f.loopbackRule(pre))
	return nil
}

// load reads which sandbox entries the kernel holds (after a restart of
// the gateway, or when a batch failed on a stale view).
func (f *Firewall) load(c *nftables.Conn) error {
	f.elems, f.chains, f.counters, f.sets = map[netip.Addr]string{}, map[string]string{}, map[string]bool{}, setIndex{}
	sets, err := c.GetSets(f.table)
	if err != nil {
		return fmt.Errorf("egress firewall: listing sets: %w", err)
	}
	for _, s := range sets {
		f.sets.add(s.Name)
	}
	objs, err := c.GetObjects(f.table)
	if err != nil {
		return fmt.Errorf("egress firewall: listing counters: %w", err)
	}
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok && strings.HasPrefix(co.Name, sandboxPrefix) {
			f.counters[co.Name] = true
		}
	}
	chains, err := f.tableChains(c)
	if err != nil {
		return fmt.Errorf("egress firewall: listing chains: %w", err)
	}
	for _, ch := range chains {
		if !strings.HasPrefix(ch.Name, sandboxPrefix) {
			continue
		}
		f.chains[ch.Name] = "" // policy unknown: the next Sync rewrites it
		if rules, err := c.GetRules(f.table, ch); err == nil && len(rules) > 0 {
			f.chains[ch.Name] = string(rules[0].UserData)
		}
	}
	els, err := c.GetSetElements(&nftables.Set{Table: f.table, Name: mapSandboxes, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict, IsMap: true})
	if err != nil {
		return fmt.Errorf("egress firewall: reading the sandboxes map: %w", err)
	}
	for _, e := range els {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			f.elems[a] = "" // target unknown, unless its chain says (below)
		}
	}
	// A chain's key starts with the address it was written for: the
	// element of that address points at it (both go in one batch).
	for name, key := range f.chains {
		if addr, _, ok := strings.Cut(key, "|"); ok {
			if a, err := netip.ParseAddr(addr); err == nil {
				if _, has := f.elems[a]; has {
					f.elems[a] = name
				}
			}
		}
	}
	return nil
}

func chainOf(id string) string { return sandboxPrefix + id }

// delElem batches the deletion of addr's map element.
func (f *Firewall) delElem(c *nftables.Conn, addr netip.Addr) {
	key := addr.As4()
	vmap := &nftables.Set{Table: f.table, Name: mapSandboxes, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict, IsMap: true}
	c.SetDeleteElements(vmap, []nftables.SetElement{{Key: key[:]}})
	delete(f.elems, addr)
}

// policyKey identifies what a chain holds, so Sync rewrites only changes.
func (f *Firewall) policyKey(e lifecycle.FirewallEntry) string {
	return e.Address.String() + "|" + rulesVersion + "|" + e.Egress.Policy + "|" + strings.Join(e.Egress.Allow, ",") +
		"|" + strings.Join(e.Egress.Deny, ",") + "|" + strconv.FormatBool(e.HostDNS) + "|" + strconv.Itoa(int(f.group))
}

// rulesVersion changes whenever sandboxRules writes other rules for the
// same policy: a chain written by an older gateway is then rewritten.
const rulesVersion = "v3"

// Apply implements lifecycle.Firewall: the sandbox's chain is written and
// its address pointed at it in one batch.
func (f *Firewall) Apply(e lifecycle.FirewallEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.table == nil {
		return fmt.Errorf("%w: the firewall is not set up", lifecycle.ErrEgressUnenforced)
	}
	if name := chainOf(e.ID); f.chains[name] == f.policyKey(e) && f.elems[e.Address] == name {
		f.track(e)
		return nil // installed as it is (a wake re-asserting it)
	}
	err := f.apply(e)
	if err != nil {
		// The view of the kernel was stale (a table changed by hand):
		// read it again and try once more.
		c, cerr := newConn()
		if cerr == nil && f.load(c) == nil {
			err = f.apply(e)
		}
	}
	return err
}

func (f *Firewall) apply(e lifecycle.FirewallEntry) error {
	c, err := newConn()
	if err != nil {
		return f.privilege(err)
	}
	sb := f.sandboxOf(e.ID)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := f.stage(c, e, sb); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return f.privilege(err)
	}
	f.committed(e, sb)
	return nil
}

// stage batches the writing of e's chain, counter, name sets and map
// element on c, from what the kernel holds now (f's view); committed
// records them once the batch went through. Entries of one batch must
// have distinct ids and addresses. The caller holds sb.mu (sb is e's
// sandbox) until the batch is flushed, so that no answer of the
// forwarder falls between the sets' contents and their writing.
func (f *Firewall) stage(c *nftables.Conn, e lifecycle.FirewallEntry, sb *sandbox) error {
	name := chainOf(e.ID)
	ch := &nftables.Chain{Table: f.table, Name: name}
	if _, ok := f.chains[name]; ok {
		c.FlushChain(ch)
	} else {
		c.AddChain(ch)
	}
	if !f.counters[name] {
		c.AddObj(&nftables.CounterObj{Table: f.table, Name: name})
	}
	sb.setRules(e)
	now := time.Now()
	contents := sb.contents(now, f.opensPrivate)
	clear(sb.written)
	for set, els := range contents {
		for _, el := range els {
			sb.written[set+"|"+el.addr.String()] = written{timeout: el.timeout, expires: now.Add(el.timeout)}
		}
	}
	for set, els := range contents {
		s := &nftables.Set{Table: f.table, Name: set, KeyType: nftables.TypeIPAddr, HasTimeout: true, Dynamic: true}
		if f.sets.has(set) {
			c.FlushSet(s)
		} else if err := c.AddSet(s, nil); err != nil {
			return err
		}
		if len(els) > 0 {
			if err := c.SetAddElements(s, setElements(els)); err != nil {
				return err
			}
		}
	}
	_, maxTTL := f.ttlBounds()
	for i, r := range sandboxRules(sb, f.net.Gateway, f.resolver, name, uint32(maxTTL/time.Second)) {
		rule := &nftables.Rule{Table: f.table, Chain: ch, Exprs: r}
		if i == 0 {
			// What the chain holds, read back after a restart (load), so
			// that a sync rewrites only what changed.
			rule.UserData = []byte(f.policyKey(e))
		}
		c.AddRule(rule)
	}
	// Sets the rules no longer use go after the rules that used them.
	for set := range f.sets[e.ID] {
		if _, used := contents[set]; !used {
			c.DelSet(&nftables.Set{Table: f.table, Name: set})
		}
	}
	vmap := &nftables.Set{Table: f.table, Name: mapSandboxes, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict, IsMap: true}
	key := e.Address.As4()
	if old, ok := f.elems[e.Address]; ok && old != name {
		// The address served another sandbox (or is of unknown target):
		// replaced in the same batch, so nothing of the old rules stays.
		if err := c.SetDeleteElements(vmap, []nftables.SetElement{{Key: key[:]}}); err != nil {
			return err
		}
	}
	if f.elems[e.Address] != name {
		if err := c.SetAddElements(vmap, []nftables.SetElement{{Key: key[:], VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: name}}}); err != nil {
			return err
		}
	}
	return nil
}

func (f *Firewall) committed(e lifecycle.FirewallEntry, sb *sandbox) {
	name := chainOf(e.ID)
	f.chains[name] = f.policyKey(e)
	f.counters[name] = true
	f.elems[e.Address] = name
	delete(f.sets, e.ID)
	for _, set := range sb.setNames() {
		f.sets.add(set)
	}
	f.publish(e, sb)
}

// sandboxOf is the state of sandbox id, made when missing (not yet
// published to the forwarder: committed and track do that).
func (f *Firewall) sandboxOf(id string) *sandbox {
	f.smu.RLock()
	sb := f.byID[id]
	f.smu.RUnlock()
	if sb == nil {
		sb = newSandbox(id)
	}
	return sb
}

// publish makes sb the state the forwarder and the log find for e.
func (f *Firewall) publish(e lifecycle.FirewallEntry, sb *sandbox) {
	f.smu.Lock()
	defer f.smu.Unlock()
	if old := f.byID[e.ID]; old != nil && old.addr != e.Address && f.byAddr[old.addr] == old {
		delete(f.byAddr, old.addr)
	}
	if other := f.byAddr[e.Address]; other != nil && other != sb {
		delete(f.byID, other.id)
	}
	f.byID[e.ID] = sb
	f.byAddr[e.Address] = sb
}

// track publishes the state of an entry the kernel already holds as it
// is (after a restart, the rules are there but the state is not).
func (f *Firewall) track(e lifecycle.FirewallEntry) {
	sb := f.sandboxOf(e.ID)
	sb.mu.Lock()
	sb.setRules(e)
	sb.mu.Unlock()
	f.publish(e, sb)
}

// forget drops sandbox id's state.
func (f *Firewall) forget(id string) {
	f.smu.Lock()
	defer f.smu.Unlock()
	if sb := f.byID[id]; sb != nil {
		delete(f.byID, id)
		if f.byAddr[sb.addr] == sb {
			delete(f.byAddr, sb.addr)
		}
	}
}

// Remove implements lifecycle.Firewall.
func (f *Firewall) Remove(id string, addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.table == nil {
		return nil
	}
	c, err := newConn()
	if err != nil {
		return err
	}
	f.remove(c, chainOf(id), addr)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress firewall: removing %s: %w", chainOf(id), err)
	}
	return nil
}

// remove batches the removal of chain and of the map element for addr
// when it points there (or anywhere unknown).
func (f *Firewall) remove(c *nftables.Conn, name string, addr netip.Addr) {
	if target, ok := f.elems[addr]; ok && (target == name || target == "") {
		f.delElem(c, addr)
	}
	if _, ok := f.chains[name]; ok {
		// Unreferenced first (map elements), then emptied, then gone.
		for a, target := range f.elems {
			if target == name || target == "" {
				f.delElem(c, a)
			}
		}
		ch := &nftables.Chain{Table: f.table, Name: name}
		c.FlushChain(ch)
		c.DelChain(ch)
		delete(f.chains, name)
	}
	if f.counters[name] {
		c.DeleteObject(&nftables.CounterObj{Table: f.table, Name: name})
		delete(f.counters, name)
	}
	id := strings.TrimPrefix(name, sandboxPrefix)
	for set := range f.sets[id] {
		c.DelSet(&nftables.Set{Table: f.table, Name: set})
	}
	delete(f.sets, id)
	f.forget(id)
}

// Sync implements lifecycle.Firewall: it reads what the kernel holds and
// makes it exactly entries.
func (f *Firewall) Sync(entries []lifecycle.FirewallEntry) (lifecycle.FirewallStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var st lifecycle.FirewallStatus
	if f.table == nil {
		return st, fmt.Errorf("%w: the firewall is not set up", lifecycle.ErrEgressUnenforced)
	}
	st.Repaired, f.repaired = f.repaired, false
	c, err := newConn()
	if err != nil {
		return st, err
	}
	known := f.chains
	if err := f.load(c); err != nil {
		return st, err
	}
	// Keep the policies this firewall wrote for chains still there.
	for name, key := range known {
		if _, ok := f.chains[name]; ok {
			f.chains[name] = key
		}
	}
	want := make(map[string]bool, len(entries))
	wantAddr := make(map[netip.Addr]bool, len(entries))
	for _, e := range entries {
		want[chainOf(e.ID)] = true
		wantAddr[e.Address] = true
	}
	rc, err := newConn()
	if err != nil {
		return st, err
	}
	for name := range f.chains {
		if !want[name] {
			f.remove(rc, name, netip.Addr{})
			st.Removed++
		}
	}
	for name := range f.counters {
		if !want[name] {
			f.remove(rc, name, netip.Addr{})
		}
	}
	for a := range f.elems {
		if !wantAddr[a] {
			f.delElem(rc, a)
		}
	}
	if err := rc.Flush(); err != nil {
		return st, fmt.Errorf("egress firewall: removing entries of sandboxes gone: %w", err)
	}
	// Everything to (re)write goes in one batch: the kernel validates the
	// whole table at each commit that adds jumps, so a commit per entry
	// would cost O(n²) after a restart, when every entry is rewritten.
	var todo []lifecycle.FirewallEntry
	for _, e := range entries {
		name := chainOf(e.ID)
		if f.chains[name] == f.policyKey(e) && f.elems[e.Address] == name {
			f.track(e)
			continue
		}
		if _, had := f.chains[name]; !had {
			st.Added++
		}
		todo = append(todo, e)
	}
	if len(todo) == 0 {
		return st, nil
	}
	bc, err := newConn()
	if err != nil {
		return st, err
	}
	staged := true
	sbs := make([]*sandbox, 0, len(todo))
	for _, e := range todo {
		sb := f.sandboxOf(e.ID)
		sb.mu.Lock()
		sbs = append(sbs, sb)
		if err := f.stage(bc, e, sb); err != nil {
			staged = false
			break
		}
	}
	flushed := staged && bc.Flush() == nil
	for _, sb := range sbs {
		sb.mu.Unlock()
	}
	if flushed {
		for i, e := range todo {
			f.committed(e, sbs[i])
		}
		return st, nil
	}
	// The batch failed as a whole (nothing of it applied): one entry at a
	// time, from a fresh view, says which one cannot be installed.
	if err := f.load(c); err != nil {
		return st, err
	}
	for _, e := range todo {
		if err := f.apply(e); err != nil {
			return st, fmt.Errorf("egress firewall: installing %s: %w", chainOf(e.ID), err)
		}
	}
	return st, nil
}

// Denied implements lifecycle.Firewall: one dump of the table's counters.
func (f *Firewall) Denied() (map[string]uint64, error) {
	f.mu.Lock()
	t := f.table
	f.mu.Unlock()
	if t == nil {
		return map[string]uint64{}, nil
	}
	c, err := newConn()
	if err != nil {
		return nil, err
	}
	objs, err := c.GetObjects(t)
	if err != nil {
		return nil, fmt.Errorf("egress firewall: reading counters: %w", err)
	}
	out := make(map[string]uint64, len(objs))
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok {
			if id, ok := strings.CutPrefix(co.Name, sandboxPrefix); ok {
				out[id] = co.Packets
			}
		}
	}
	return out, nil
}

// DeniedRanges implements lifecycle.Firewall.
func (f *Firewall) DeniedRanges() []netip.Prefix {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.denied == nil {
		return slices.Concat(f.opts.Deny, HostAddresses())
	}
	return slices.Clone(f.denied)
}

// Interface guard.
var _ lifecycle.Firewall = (*Firewall)(nil)
