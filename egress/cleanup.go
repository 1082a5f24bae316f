package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"

	"github.com/google/nftables"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/sandwake/sandwake/egress/dnswire"
	"github.com/sandwake/sandwake/lifecycle"
)

// This file removes the tables of sandbox networks that are gone. Both
// tables of a bridge (TableName, families inet and bridge) belong to its
// network, but the engine knows nothing of them: a network removed behind
// sandwake's back (`docker network rm` of a stopped gateway's network)
// would leave them on the host forever. A table is stale
// when no interface bears the name of its bridge: the bridge went with its
// network. A bridge that exists is left alone, whichever instance it is
// (its gateway may be stopped, or be another's); tables not named
// sandwake-<bridge> (another tool's, a probe's) are never touched.

// tablePrefix starts the name of every table of sandwake's (TableName).
const tablePrefix = "sandwake-"

// probePrefix starts the names of the temporary tables of
// probeTimeoutUpdates, which belong to no bridge.
const probePrefix = "probe-"

// maxIfName is the longest interface name Linux allows (IFNAMSIZ less
// the terminating NUL): a longer "bridge" is not one.
const maxIfName = 15

// tablesRemoved counts the tables this process removed (stale or by
// RemoveTables), for the metrics (TablesRemoved).
var tablesRemoved atomic.Uint64

// TablesRemoved is how many tables of gone sandbox networks this process
// removed (caddy_sandwake_egress_tables_removed_total).
func TablesRemoved() uint64 { return tablesRemoved.Load() }

// bridgeOf is the bridge a table of sandwake's is named after, and false
// for any other table (another tool's, a probe's).
func bridgeOf(table string) (string, bool) {
	br, ok := strings.CutPrefix(table, tablePrefix)
	if !ok || br == "" || len(br) > maxIfName || strings.HasPrefix(br, probePrefix) {
		return "", false
	}
	return br, true
}

// tableFamilies are the families sandwake makes a table of per bridge.
var tableFamilies = []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge}

func familyName(f nftables.TableFamily) string {
	if f == nftables.TableFamilyBridge {
		return "bridge"
	}
	return "inet"
}

// RemoveStaleTables removes every table of sandwake's whose bridge no
// longer exists, logging each, and answers them as "<family> <name>".
// It needs CAP_NET_ADMIN.
func RemoveStaleTables(log *zap.Logger) ([]string, error) {
	if log == nil {
		log = zap.NewNop()
	}
	c, err := newConn()
	if err != nil {
		return nil, fmt.Errorf("removing stale firewall tables: %w", err)
	}
	return removeStale(c, log)
}

// removeStale is RemoveStaleTables on c. The interfaces are read after the
// tables: a bridge made meanwhile, with its tables, is seen and kept.
func removeStale(c *nftables.Conn, log *zap.Logger) ([]string, error) {
	var found []*nftables.Table
	for _, fam := range tableFamilies {
		tables, err := c.ListTablesOfFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("removing stale firewall tables: listing %s tables: %w", familyName(fam), err)
		}
		for _, t := range tables {
			if _, ok := bridgeOf(t.Name); ok {
				found = append(found, t)
			}
		}
	}
	if len(found) == 0 {
		return nil, nil
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		// Unknown which bridges exist: nothing is removed.
		return nil, fmt.Errorf("removing stale firewall tables: listing interfaces: %w", err)
	}
	exists := make(map[string]bool, len(ifaces))
	for _, i := range ifaces {
		exists[i.Name] = true
	}
	var removed []string
	var errs []error
	for _, t := range found {
		br, _ := bridgeOf(t.Name)
		if exists[br] {
			continue
		}
		// The snapshot may be old by now: a network made again meanwhile
		// has its bridge back under the same name (fixed per network
		// name), with live tables. So ask again right before the delete.
		// What remains is the time between this check and the delete's
		// flush (a netlink round trip or two): a bridge made in it loses
		// its tables until its gateway's next Setup.
		if again, err := bridgeExists(br); err != nil || again {
			if err != nil {
				errs = append(errs, fmt.Errorf("removing stale firewall table %s %s: %w", familyName(t.Family), t.Name, err))
			}
			continue
		}
		ok, err := deleteTable(c, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			name := familyName(t.Family) + " " + t.Name
			removed = append(removed, name)
			log.Info("removed the egress firewall table of a sandbox network that is gone (no interface "+br+")", zap.String("table", name))
		}
	}
	return removed, errors.Join(errs...)
}

// bridgeExists asks whether an interface named br exists now. An error
// says the interfaces could not be read (so whether it exists is unknown),
// not that it is missing.
func bridgeExists(br string) (bool, error) {
	_, err := net.InterfaceByName(br)
	if err == nil {
		return true, nil
	}
	// Reading the interfaces failed (netlinkrib, netlinkmessage); "no
	// such network interface" is none of these.
	if se := (*os.SyscallError)(nil); errors.As(err, &se) {
		return false, fmt.Errorf("reading interface %s: %w", br, err)
	}
	return false, nil
}

// RemoveTables removes both tables of bridge (TableName, families inet and
// bridge), once its network is removed, and answers those it removed as
// "<family> <name>"; missing ones are not an error. It refuses while the
// bridge exists: its tables are in force for the sandboxes on it.
func RemoveTables(bridge string) ([]string, error) {
	if _, ok := bridgeOf(TableName(bridge)); !ok {
		return nil, fmt.Errorf("removing the firewall tables of %q: not a bridge name", bridge)
	}
	if _, err := net.InterfaceByName(bridge); err == nil {
		return nil, fmt.Errorf("removing the firewall tables of bridge %s: the bridge still exists (its network is not removed), so its tables are in force", bridge)
	}
	c, err := newConn()
	if err != nil {
		return nil, fmt.Errorf("removing the firewall tables of bridge %s: %w", bridge, err)
	}
	var removed []string
	for _, fam := range tableFamilies {
		tables, err := c.ListTablesOfFamily(fam)
		if err != nil {
			return removed, fmt.Errorf("removing the firewall tables of bridge %s: listing %s tables: %w", bridge, familyName(fam), err)
		}
		for _, t := range tables {
			if t.Name != TableName(bridge) {
				continue
			}
			ok, err := deleteTable(c, t)
			if err != nil {
				return removed, err
			}
			if ok {
				removed = append(removed, familyName(fam)+" "+t.Name)
			}
		}
	}
	return removed, nil
}

// deleteTable deletes t and counts it; false when it was gone already
// (removed by another gateway meanwhile).
func deleteTable(c *nftables.Conn, t *nftables.Table) (bool, error) {
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("removing firewall table %s %s: %w", familyName(t.Family), t.Name, err)
	}
	tablesRemoved.Add(1)
	return true, nil
}

// RemoveStale removes the tables of every sandbox network that is gone
// (RemoveStaleTables), this firewall's own included: when its network is
// made again, the next Setup installs them anew. The Manager calls it when
// the engine reports a network removed.
func (f *Firewall) RemoveStale() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.removeStale()
}

// removeStale is RemoveStale with f.mu held (Setup calls it, so that every
// start clears what earlier networks left).
func (f *Firewall) removeStale() ([]string, error) {
	c, err := newConn()
	if err != nil {
		return nil, fmt.Errorf("removing stale firewall tables: %w", err)
	}
	removed, err := removeStale(c, f.log)
	for _, name := range removed {
		if isTable(name, f.table) || isTable(name, f.btable) {
			// Nothing of what this firewall knew of its tables holds: the
			// next Setup installs them as new (not as a repair).
			f.elems, f.chains, f.counters, f.sets, f.bindings = nil, nil, nil, setIndex{}, nil
			// Nor may the port watcher write to a table that is gone; the
			// next Setup lists the ports into the new one.
			f.ports.mu.Lock()
			f.ports.table, f.ports.members = nil, nil
			f.ports.mu.Unlock()
		}
	}
	return removed, err
}

// isTable reports whether name ("<family> <name>") is t.
func isTable(name string, t *nftables.Table) bool {
	return t != nil && name == familyName(t.Family)+" "+t.Name
}

// Serving reports whether a socket of this network namespace is bound to
// port 53 of gw, the gateway address of a sandbox network: a gateway's DNS
// forwarder, so a gateway enforcing egress on that network runs. (One
// without a firewall, egress unenforced, is not seen.) It reads the
// kernel's socket tables: nothing is bound or dialled, so a gateway
// starting meanwhile is not disturbed. Those are this network namespace's
// tables: the caller makes sure the network's bridge is in it (else no
// gateway is seen; cli's uninstall refuses).
func Serving(gw netip.Addr) bool {
	if !gw.Is4() {
		return false
	}
	b := gw.As4()
	// The tables print the address as the kernel holds it (network
	// order) read as a native integer, and the port in hex.
	want := fmt.Sprintf("%08X:%04X", binary.NativeEndian.Uint32(b[:]), dnswire.Port)
	// Only a listening socket is a server: state (the fourth field) 0A,
	// TCP_LISTEN, for TCP; 07, TCP_CLOSE (unconnected), for UDP. A
	// connection's socket (TIME_WAIT, a connected UDP socket) lingers
	// after its server is gone.
	for _, table := range []struct{ path, state string }{{"/proc/thread-self/net/udp", "07"}, {"/proc/thread-self/net/tcp", "0A"}} {
		data, err := os.ReadFile(table.path)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			if fields := strings.Fields(line); len(fields) > 3 && fields[1] == want && fields[3] == table.state {
				return true
			}
		}
	}
	return false
}

// Interface guard.
var _ lifecycle.StaleRemover = (*Firewall)(nil)
