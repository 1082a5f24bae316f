// Package cluster joins sandwake nodes into one cluster over etcd: a node
// registry on leases, the sandbox catalog each owner publishes after its
// Badger commit, cluster-wide unique ids, placement of creates, and the
// signing of node-to-node requests. It imports lifecycle for the domain
// types and is imported only by the Caddy module's wiring; without a
// cluster block none of it runs. See docs/DESIGN.md, "Cluster mode".
package cluster

import (
	"context"
	"errors"
	"net/http"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/lifecycle"
)

// Defaults of a Config.
const (
	DefaultPrefix   = "/sandwake/"
	DefaultLeaseTTL = 10 * time.Second
)

// Errors of the cluster. Callers match them with errors.Is.
var (
	// ErrTaken: the id is in the catalog already (owned by any node).
	ErrTaken = errors.New("id is taken in the cluster")
	// ErrEtcd: etcd could not be reached or did not answer in time. The
	// error's text names the endpoints and etcd's own words.
	ErrEtcd = errors.New("etcd unreachable")
	// ErrNoRoom: no live, non-draining node has room for the spec.
	ErrNoRoom = errors.New("no node has room")
	// ErrUnknownNode: no node of that name is registered or known.
	ErrUnknownNode = errors.New("unknown node")
	// ErrUnsigned: a request claims to be forwarded by a node but its
	// signature is missing, malformed, stale or wrong.
	ErrUnsigned = errors.New("forwarded request not signed by a cluster node")
)

// Config is the cluster block of the sandwake app.
type Config struct {
	// Endpoints are etcd's client URLs.
	Endpoints []string
	// Node is this node's name; it is also the gateway's instance name.
	Node string
	// Advertise is host:port of this node's preview listener (plain HTTP),
	// as other nodes dial it to forward preview requests.
	Advertise string
	// AdvertiseAPI is host:port of this node's management API listener,
	// as other nodes dial it to forward API calls.
	AdvertiseAPI string
	// Secret signs node-to-node requests; every node has the same.
	Secret []byte
	// Prefix is the key prefix in etcd (DefaultPrefix when empty).
	Prefix string
	// LeaseTTL is the node's lease: a node silent this long is lost.
	LeaseTTL time.Duration
	// Logger receives the cluster's log lines (zap.NewNop when nil).
	Logger *zap.Logger
}

// Capacity is what a node publishes about its room, refreshed with its
// lease.
type Capacity struct {
	Resident     int   `json:"resident"`
	MaxResident  int   `json:"max_resident"`
	FreeMemoryMB int64 `json:"free_memory_mb"`
	// MinFreeMemoryMB is the node's min_free_memory (0: none).
	MinFreeMemoryMB int64 `json:"min_free_memory_mb"`
}

// NodeInfo is one node as the registry knows it.
type NodeInfo struct {
	Name         string   `json:"name"`
	Advertise    string   `json:"advertise"`
	AdvertiseAPI string   `json:"advertise_api"`
	Capacity     Capacity `json:"capacity"`
	// Draining nodes get no new sandboxes (kept apart from the lease, so
	// it survives restarts).
	Draining bool `json:"draining"`
	// Live is whether the node's lease is held.
	Live bool `json:"live"`
	// Sandboxes is how many catalog entries name the node.
	Sandboxes int       `json:"sandboxes"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Entry is one sandbox in the catalog, written by its owner node.
type Entry struct {
	ID              string            `json:"id"`
	Node            string            `json:"node"`
	State           lifecycle.State   `json:"state"`
	Reason          string            `json:"reason,omitempty"`
	Ports           []int             `json:"ports"`
	Access          string            `json:"access,omitempty"`
	Incarnation     string            `json:"incarnation,omitempty"`
	TokenGeneration uint64            `json:"token_generation,omitempty"`
	MemoryMB        int64             `json:"memory_mb,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	CreatedAt       time.Time         `json:"created_at"`
	UpdatedAt       time.Time         `json:"updated_at"`
	// Revision is etcd's mod revision of the entry (not stored in it).
	Revision int64 `json:"-"`
}

// Source is what the cluster reads from its own node: the records it
// publishes and the capacity it registers.
type Source interface {
	Get(id string) (lifecycle.Record, error)
	List(state lifecycle.State) ([]lifecycle.Record, error)
	Capacity() Capacity
}

// Change is one catalog change seen by the watch.
type Change struct {
	Entry   Entry
	Deleted bool
}

// Cluster is one node's view of and part in the cluster.
type Cluster struct {
	cfg Config
	src Source
	cli *clientv3.Client
}

// New checks cfg and builds the node's cluster client; it contacts
// nothing (see Start).
func New(cfg Config, src Source) (*Cluster, error) { panic("cluster: to be written") }

// Start registers the node on a lease, loads the catalog and the node
// registry, starts the watches, the publisher (republishing every local
// record whenever it (re)connects) and the lease keeper. It returns once
// the first sync ended or failed; with etcd down the node still starts
// (Health says why) and keeps retrying.
func (c *Cluster) Start(ctx context.Context) error { panic("cluster: to be written") }

// Close revokes the lease (the node leaves at once) and stops everything.
func (c *Cluster) Close() error { panic("cluster: to be written") }

// Self is this node's name.
func (c *Cluster) Self() string { return c.cfg.Node }

// Changed marks sandbox id for publishing (the Manager's OnChange hook);
// it never blocks and never touches the network itself.
func (c *Cluster) Changed(id string) { panic("cluster: to be written") }

// Lookup returns the catalog entry of id from memory (no etcd call, no
// allocation): the request path calls it.
func (c *Cluster) Lookup(id string) (Entry, bool) { panic("cluster: to be written") }

// Entries returns the whole catalog from memory, sorted by id.
func (c *Cluster) Entries() []Entry { panic("cluster: to be written") }

// Node returns a node's registry entry from memory; Live is false when its
// lease is gone.
func (c *Cluster) Node(name string) (NodeInfo, bool) { panic("cluster: to be written") }

// Nodes returns every known node (live, or named by the catalog or a drain
// mark), sorted by name.
func (c *Cluster) Nodes() []NodeInfo { panic("cluster: to be written") }

// Reserve claims id for this node in one etcd transaction (the key must
// not exist): ErrTaken when any node holds it, ErrEtcd when etcd cannot
// answer.
func (c *Cluster) Reserve(ctx context.Context, id string, memoryMB int64) error {
	panic("cluster: to be written")
}

// Release removes this node's entry of id if it is still this node's (a
// create that failed, a destroy).
func (c *Cluster) Release(ctx context.Context, id string) error { panic("cluster: to be written") }

// Place picks the node a new sandbox of memoryMB goes to: live, not
// draining, resident below max_resident, free memory above its minimum
// plus memoryMB; least loaded first (resident/max_resident, then free
// memory, then name). ErrNoRoom names why each node was passed over.
func (c *Cluster) Place(memoryMB int64) (NodeInfo, error) { panic("cluster: to be written") }

// Drain sets or clears node's draining mark.
func (c *Cluster) Drain(ctx context.Context, node string, on bool) error {
	panic("cluster: to be written")
}

// Remove forgets a node that is gone for good: its registry entry and
// drain mark are deleted and its catalog entries marked killed (reason
// "node_removed"). A live node cannot be removed.
func (c *Cluster) Remove(ctx context.Context, node string) (killed int, err error) {
	panic("cluster: to be written")
}

// Watch calls fn for every catalog change after it was registered, in
// etcd's order, from the watch goroutine (fn must not block).
func (c *Cluster) Watch(fn func(Change)) { panic("cluster: to be written") }

// Health is nil while etcd answers; otherwise an error wrapping ErrEtcd
// that names the endpoints and the last failure.
func (c *Cluster) Health() error { panic("cluster: to be written") }

// Stats are the cluster's figures for metrics.
type Stats struct {
	LiveNodes int
	// Pending is how many local changes wait to be published, and
	// OldestPending how long the oldest has waited (the catalog lag).
	Pending       int
	OldestPending time.Duration
	EtcdErrors    uint64
}

// Stats returns the current figures.
func (c *Cluster) Stats() Stats { panic("cluster: to be written") }

// ForwardHeader carries the signature of a node-to-node request.
const ForwardHeader = "Sandwake-Forwarded"

// Sign marks r as forwarded by this node: ForwardHeader set to
// "<node>;<unix seconds>;<hex hmac>" over node, time, method, host and
// request URI with the cluster secret.
func (c *Cluster) Sign(r *http.Request) { panic("cluster: to be written") }

// Verify checks r's ForwardHeader: ok=false when r carries none;
// an error wrapping ErrUnsigned when it is present but not valid (wrong
// signature, unknown shape, older than a minute or from the future).
func (c *Cluster) Verify(r *http.Request) (node string, ok bool, err error) {
	panic("cluster: to be written")
}
