package peer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/lifecycle"
)

// Source is what the cluster reads of its own node: the manager's
// records and the node's room.
type Source struct {
	Mgr    *lifecycle.Manager
	Limits *Limits
	// NoHostMemory leaves the host's free memory out of the capacity:
	// sandboxes do not run on the gateway's host (engine kubernetes, where
	// the scheduler places pods on nodes by their own room).
	NoHostMemory bool
}

// Get is the manager's record of sandbox id.
func (s Source) Get(id string) (lifecycle.Record, error) { return s.Mgr.Get(id) }

// List lists the manager's records in state.
func (s Source) List(state lifecycle.State) ([]lifecycle.Record, error) {
	return s.Mgr.List(state)
}

// Capacity is the room the node has: resident sandboxes, its limits, free
// memory and idle pool containers by template.
func (s Source) Capacity() cluster.Capacity {
	resident, reserved := s.Mgr.Resident()
	c := cluster.Capacity{
		Resident:        resident + reserved,
		MaxResident:     int(s.Limits.MaxResident.Load()),
		MinFreeMemoryMB: int64(s.Limits.MinFreeBytes.Load() >> 20),
	}
	if !s.NoHostMemory {
		if avail, err := lifecycle.HostMemAvailable(); err == nil {
			c.FreeMemoryMB = int64(avail >> 20)
		}
	}
	for _, t := range s.Mgr.Templates() {
		if t.Idle > 0 {
			if c.Pools == nil {
				c.Pools = map[string]int{}
			}
			c.Pools[t.Template.Name] = t.Idle
		}
	}
	return c
}

// Node is the engine's part in a cluster; nil in single-host mode.
type Node struct {
	// Cluster is the node's membership: catalog, registry, placement,
	// request signatures.
	*cluster.Cluster
	log *zap.Logger
	// Remote fans the catalog changes of other nodes' sandboxes out to
	// the API's event streams.
	Remote *RemoteEvents
	// Peers are the node's certificate and the cluster CA, replaced at
	// each config load.
	Peers *cluster.PeerTLS
	// listener is the peer listener: the other nodes' forwarded requests.
	listener *peerListener
	// transports carry forwarded requests to the other nodes, one per
	// node and address (node + "\x00" + host:port → *http.Transport): a
	// connection is only ever reused for the node it was verified as.
	transports sync.Map
	// Plaintext: etcd is spoken to over plaintext http
	// (insecure_plaintext); readyz flags it.
	Plaintext bool
	// onUnsigned counts a request refused on the peer listener for its
	// signature (the preview path's request metric).
	onUnsigned func()
}

// NewNode is the node's part in cluster c: the peer listener (not yet
// listening), the fan-out of other nodes' changes, the transports to them.
// onUnsigned is called for each forwarded request refused for its
// signature (nil: they are not counted).
func NewNode(c *cluster.Cluster, peers *cluster.PeerTLS, log *zap.Logger, onUnsigned func()) *Node {
	cs := &Node{Cluster: c, log: log, Remote: newRemoteEvents(c.Self()), Peers: peers, onUnsigned: onUnsigned}
	cs.listener = newPeerListener(cs, log.Named("cluster.peer"))
	c.Watch(cs.Remote.observe)
	return cs
}

// SetTargets sets what the peer listener hands forwarded requests to: the
// preview site's server and the API handler (either nil when the config
// has none).
func (cs *Node) SetTargets(preview, api http.Handler) {
	cs.listener.targets.Store(&peerTargets{preview: preview, api: api})
}

// Start opens the peer listener on listen and joins the cluster once the
// manager runs (it stands in for the embedded Cluster's Start, which only
// joins). With etcd down the node still starts: readyz says why, and the
// cluster keeps retrying.
func (cs *Node) Start(listen string) error {
	// Listening before registering: a node the others see live accepts
	// their connections.
	if err := cs.listener.start(listen); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cs.Cluster.Start(ctx); err != nil && !errors.Is(err, cluster.ErrEtcd) {
		return fmt.Errorf("sandwake: starting cluster membership: %w", err)
	}
	if err := cs.Health(); err != nil {
		cs.log.Warn("joined the cluster without etcd (routes and local wakes work; creates wait for etcd)", zap.Error(err))
	} else {
		cs.log.Info("joined the cluster", zap.String("node", cs.Self()), zap.String("peer_listen", listen))
	}
	return nil
}

// Close leaves the cluster (the lease is revoked: other nodes see this
// node gone at once), then closes the peer listener and stops forwarding
// (it stands in for the embedded Cluster's Close, which only leaves).
func (cs *Node) Close() error {
	err := cs.Cluster.Close()
	cs.Remote.close()
	lerr := cs.listener.close()
	cs.transports.Range(func(_, v any) bool {
		v.(*http.Transport).CloseIdleConnections()
		return true
	})
	if err != nil {
		return fmt.Errorf("leaving the cluster: %w", err)
	}
	return lerr
}

// CertRenewWarning is how long before its end a node certificate is
// flagged (start-up log, readyz).
const CertRenewWarning = 7 * 24 * time.Hour

// Limits holds the capacity limits of the current config, read by
// the cluster's lease keeper and by placement.
type Limits struct {
	MaxResident  atomic.Int64
	MinFreeBytes atomic.Uint64
	// DefaultMemMB is the memory a create without one is placed with.
	DefaultMemMB atomic.Int64
}
