package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

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
	// ErrEtcd: the cluster's store (etcd, or the Kubernetes API) could not
	// be reached or did not answer in time. The error's text names the
	// store, where it is, and its own words.
	ErrEtcd = errors.New("cluster store unreachable")
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
	// Endpoints are etcd's client URLs (the etcd backend).
	Endpoints []string
	// Kubernetes, when set, is the backend instead of etcd: the Kubernetes
	// API, one Lease per node and per sandbox in a namespace (see
	// kubestore.go). Endpoints, TLS, Username and Password are then unused.
	Kubernetes *KubeBackend
	// Node is this node's name; it is also the gateway's instance name.
	Node string
	// Advertise is host:port of this node's peer listener as other nodes
	// dial it (mutual TLS) to forward preview requests and API calls.
	// The node's certificate must cover its host.
	Advertise string
	// Peers are the node's certificate and the cluster's CAs: the
	// certificate is published with the registration, and other nodes'
	// registrations count only with a certificate of the cluster's CA
	// naming them and covering their advertised host. Required.
	Peers *PeerTLS
	// Secret signs node-to-node requests (inside the mutual TLS, as a
	// second factor); every node has the same.
	Secret []byte
	// Prefix is the key prefix in etcd (DefaultPrefix when empty).
	Prefix string
	// LeaseTTL is the node's lease: a node silent this long is lost.
	LeaseTTL time.Duration
	// Logger receives the cluster's log lines (zap.NewNop when nil).
	Logger *zap.Logger
	// TLS is the client TLS configuration for https:// endpoints: the CA
	// to verify etcd with and the client certificate. Nil: plaintext.
	TLS *tls.Config
	// Username and Password authenticate to etcd (its auth enabled);
	// empty: none.
	Username, Password string
}

// Capacity is what a node publishes about its room, refreshed with its
// lease.
type Capacity struct {
	Resident     int   `json:"resident"`
	MaxResident  int   `json:"max_resident"`
	FreeMemoryMB int64 `json:"free_memory_mb"`
	// MinFreeMemoryMB is the node's min_free_memory (0: none).
	MinFreeMemoryMB int64 `json:"min_free_memory_mb"`
	// Pools counts the node's idle warm pool containers by template:
	// placement prefers a node that can claim one.
	Pools map[string]int `json:"pools,omitempty"`
}

// Bounds of what a node may publish of its room: a registration claiming
// more (a forged one, to draw every create) is read as at most these.
const (
	MaxPublishedResident = 1 << 20
	MaxPublishedMemoryMB = 1 << 24 // 16 TiB
	MaxPublishedPools    = 256
)

// bounded clamps a published capacity to what a node can have.
func (c Capacity) bounded() Capacity {
	c.Resident = min(max(c.Resident, 0), MaxPublishedResident)
	c.MaxResident = min(max(c.MaxResident, 0), MaxPublishedResident)
	c.FreeMemoryMB = min(max(c.FreeMemoryMB, 0), MaxPublishedMemoryMB)
	c.MinFreeMemoryMB = min(max(c.MinFreeMemoryMB, 0), MaxPublishedMemoryMB)
	if len(c.Pools) > MaxPublishedPools {
		c.Pools = nil // a forged registration: no pool is believed
	}
	for t, n := range c.Pools {
		c.Pools[t] = min(max(n, 0), MaxPublishedResident)
	}
	return c
}

// NodeInfo is one node as the registry knows it.
type NodeInfo struct {
	Name string `json:"name"`
	// Advertise is the node's peer listener (host:port).
	Advertise string   `json:"advertise"`
	Capacity  Capacity `json:"capacity"`
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
	// Sig is the writing node's signature of every other field (see
	// seal.go); readers ignore an entry whose signature fails.
	Sig string `json:"sig,omitempty"`
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
	// st is the backend (etcd or the Kubernetes API), made by Start.
	st  store
	log *zap.Logger
	// placed counts the creates this node placed since each node's last
	// registration (see Place).
	placed placements
	// now is the clock of signatures and entries (time.Now; tests set it).
	now func() time.Time
	// reqTimeout bounds every etcd request, so that a create fails fast
	// when etcd is gone.
	reqTimeout time.Duration
	// endpoints names the store and where it is, for error messages.
	endpoints string
	// dialOptions are added to the etcd client's (tests intercept calls
	// with them).
	dialOptions []grpc.DialOption

	cache catalog

	// macs holds keyed HMAC-SHA256 hashes of cfg.Secret for Sign and
	// Verify (*macState; Reset restores a hash's keyed state).
	macs sync.Pool
	// ekey signs catalog entries (derived from cfg.Secret, see seal.go);
	// rejected counts entries read whose signature failed, repairs this
	// node's entries it wrote back from its records.
	ekey     []byte
	rejected atomic.Uint64
	repairs  atomic.Uint64

	subsMu sync.Mutex
	subs   []func(Change)

	pub publisher

	// health is the last etcd failure, nil after a success; writeHealth
	// the last failure of a write, nil after a write that worked.
	health      atomic.Pointer[etcdFailure]
	writeHealth atomic.Pointer[etcdFailure]
	etcdErrors  atomic.Uint64
	// lease is the node's current lease (0: none held).
	lease atomic.Int64
	// lastReserve is the last reservation's time (unix ns).
	lastReserve atomic.Int64

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	startOnce sync.Once
	closeOnce sync.Once
}

// requestTimeout bounds each etcd request: long enough for a leader
// election among healthy members, short enough that a create answers 503
// promptly when etcd is gone.
const requestTimeout = 2 * time.Second

// New checks cfg and builds the node's cluster client; it contacts
// nothing (see Start).
func New(cfg Config, src Source) (*Cluster, error) {
	if cfg.Kubernetes != nil {
		if err := cfg.Kubernetes.check(); err != nil {
			return nil, err
		}
	} else if len(cfg.Endpoints) == 0 {
		return nil, errors.New("cluster: no etcd endpoints")
	}
	for _, ep := range cfg.Endpoints {
		if strings.TrimSpace(ep) == "" {
			return nil, errors.New("cluster: empty etcd endpoint")
		}
	}
	if cfg.Node == "" {
		return nil, errors.New("cluster: node name is empty")
	}
	if strings.ContainsAny(cfg.Node, "/; \t\r\n") {
		return nil, fmt.Errorf("cluster: node name %q may not contain '/', ';' or spaces", cfg.Node)
	}
	if len(cfg.Secret) == 0 {
		return nil, errors.New("cluster: secret is empty (every node needs the same secret to sign forwarded requests)")
	}
	if src == nil {
		return nil, errors.New("cluster: no source of local records")
	}
	if err := checkIdentity(cfg); err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.Kubernetes != nil {
		if err := checkKubePrefix(cfg.Prefix); err != nil {
			return nil, err
		}
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.LeaseTTL < time.Second {
		return nil, fmt.Errorf("cluster: lease TTL %s is below etcd's granularity of one second", cfg.LeaseTTL)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cfg.Endpoints = slices.Clone(cfg.Endpoints)
	cfg.Secret = slices.Clone(cfg.Secret)
	c := &Cluster{
		cfg:        cfg,
		src:        src,
		log:        cfg.Logger,
		now:        time.Now,
		reqTimeout: requestTimeout,
		endpoints:  "etcd at " + strings.Join(cfg.Endpoints, ","),
	}
	if cfg.Kubernetes != nil {
		c.endpoints = cfg.Kubernetes.String()
	}
	c.ekey = c.entryKey()
	c.cache.init()
	c.pub.init()
	c.health.Store(&etcdFailure{err: fmt.Errorf("%w (%s): not connected yet", ErrEtcd, c.endpoints)})
	return c, nil
}

// checkIdentity refuses credentials that other nodes would refuse: a
// certificate of another node, or one not covering the advertised host.
func checkIdentity(cfg Config) error {
	if cfg.Peers == nil || cfg.Peers.Current() == nil {
		return errors.New("cluster: no peer credentials (the node's certificate and the cluster's CA)")
	}
	cr := cfg.Peers.Current()
	if cr.Node != cfg.Node {
		return fmt.Errorf("cluster: the node certificate names node %s, but this node is %s", cr.Node, cfg.Node)
	}
	host, _, err := net.SplitHostPort(cfg.Advertise)
	if err != nil {
		return fmt.Errorf("cluster: advertise %q is not host:port", cfg.Advertise)
	}
	if err := cr.Cert.Leaf.VerifyHostname(host); err != nil {
		return fmt.Errorf("cluster: the node certificate does not cover the advertised host (other nodes would refuse it): %w", err)
	}
	return nil
}

// Start registers the node on a lease, loads the catalog and the node
// registry, starts the watches, the publisher (republishing every local
// record whenever it (re)connects) and the lease keeper. It returns once
// the first sync ended or failed; with etcd down the node still starts
// (Health says why) and keeps retrying.
func (c *Cluster) Start(ctx context.Context) error {
	err := errors.New("cluster: already started")
	c.startOnce.Do(func() { err = c.start(ctx) })
	return err
}

func (c *Cluster) start(ctx context.Context) error {
	if c.cfg.Kubernetes != nil {
		c.st = newKubeStore(*c.cfg.Kubernetes, c.cfg.Prefix, c.cfg.Node, c.cfg.LeaseTTL)
	} else {
		st, err := newEtcdStore(c.cfg, c.reqTimeout, c.log, c.dialOptions)
		if err != nil {
			return err
		}
		c.st = st
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	registered, loaded, published := make(chan struct{}), make(chan struct{}), make(chan struct{})
	c.wg.Add(3)
	go c.runRegistry(registered)
	go c.runCatalog(loaded)
	go c.runPublisher(published)
	for _, first := range []chan struct{}{registered, loaded, published} {
		select {
		case <-first:
		case <-ctx.Done():
			return fmt.Errorf("cluster: starting: %w", ctx.Err())
		}
	}
	if err := c.Health(); err != nil {
		c.log.Warn("cluster started without its store; retrying in the background", zap.String("store", c.endpoints), zap.Error(err))
	}
	return nil
}

// Close revokes the lease (the node leaves at once) and stops everything.
func (c *Cluster) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.startOnce.Do(func() {}) // a Start after Close does nothing
		if c.st == nil {
			return
		}
		c.cancel()
		c.wg.Wait()
		if id := leaseID(c.lease.Load()); id != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if rerr := c.st.Revoke(ctx, id); rerr != nil {
				c.log.Warn("revoking the node's lease (it expires by itself)", zap.Error(rerr))
			}
			cancel()
		}
		if cerr := c.st.Close(); cerr != nil && !errors.Is(cerr, context.Canceled) {
			err = fmt.Errorf("cluster: closing the %s client: %w", c.st, cerr)
		}
	})
	return err
}

// Self is this node's name.
func (c *Cluster) Self() string { return c.cfg.Node }

// Health is nil while etcd answers; otherwise an error wrapping ErrEtcd
// that names the endpoints and the last failure.
func (c *Cluster) Health() error {
	if f := c.writeHealth.Load(); f != nil {
		return f.err
	}
	if f := c.health.Load(); f != nil {
		return f.err
	}
	return nil
}

// Stats are the cluster's figures for metrics.
type Stats struct {
	LiveNodes int
	// Pending is how many local changes wait to be published, and
	// OldestPending how long the oldest has waited (the catalog lag).
	Pending       int
	OldestPending time.Duration
	EtcdErrors    uint64
	// RejectedEntries counts catalog entries read whose signature failed
	// (forged, or written by a node without the cluster's secret);
	// Repairs this node's entries it wrote back from its records.
	RejectedEntries uint64
	Repairs         uint64
}

// Stats returns the current figures.
func (c *Cluster) Stats() Stats {
	pending, oldest := c.pub.pending()
	s := Stats{
		LiveNodes:  c.cache.liveNodes(),
		Pending:    pending,
		EtcdErrors: c.etcdErrors.Load(),

		RejectedEntries: c.rejected.Load(),
		Repairs:         c.repairs.Load(),
	}
	if pending > 0 {
		s.OldestPending = c.now().Sub(oldest)
	}
	return s
}
