package caddymodule

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	core "github.com/sandwake/sandwake/engine"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/lifecycle"
)

// settings are the per-config values the request path reads; a reload swaps
// them atomically.
type settings struct {
	domain      string
	holdTimeout time.Duration
	// maxOpen is max_open_per_sandbox (0: no cap).
	maxOpen    int64
	previewURL string
	// previewSecret signs preview tokens (configured, or the stored one).
	previewSecret []byte
	robotsTxt     bool
	// xRobotsTag is the X-Robots-Tag header value (nil: none), a full
	// slice (len == cap) shared by every response.
	xRobotsTag []string
}

// previewURL is the user-facing URL of sandbox id's port.
func (s *settings) previewURLOf(id string, port int) string {
	return strings.Replace(s.previewURL, "*", "s-"+id+"-"+strconv.Itoa(port), 1) + "/"
}

// engine is the long-lived runtime shared by every config with the same
// storage directory.
type engine struct {
	// core is the store, runtime and manager (mgr is core.Manager).
	core    *core.Engine
	mgr     *lifecycle.Manager
	routes  *routeCache
	log     *zap.Logger
	ready   atomic.Bool
	current atomic.Pointer[settings]
	guard   *wakeGuard
	streams *streamLimiter
	// storedSecret is the preview secret kept in the store, used when no
	// preview_secret is configured.
	storedSecret []byte

	dockerHost, upstreamMode, network string
	// upstreams is the upstream mode in force (direct, published or
	// network), upstreamsWhy why: readyz and the start-up log say them.
	upstreams, upstreamsWhy string

	// instance is the gateway's instance name (configured or kept).
	instance string
	// storeWarning, when set, says the store looks lost (readyz shows it).
	storeWarning string
	// egressUnenforced: the operator turned the egress firewall off.
	egressUnenforced bool
	// clients are the per-client wake and hold budgets of the preview path.
	clients *clientLimits
	// isolation is what the engine applies to sandboxes (readyz shows it).
	isolation isolationState

	// cluster is the node's part in a cluster, nil on a single host;
	// clusterCfg the cluster block it was joined with.
	cluster    *clusterState
	clusterCfg *ClusterConfig
	clusterFigures
}

// changed is the manager's change hook: the route is dropped from the cache
// and, in a cluster, the sandbox queued for publishing.
func (e *engine) changed(id string) {
	e.routes.invalidate(id)
	if e.cluster != nil {
		e.cluster.c.Changed(id)
	}
}

// observeWake is the manager's wake hook: metrics, the failing-wake
// backoff, and the log line with the engine's words.
func (e *engine) observeWake(w lifecycle.WakeResult) {
	observeWake(w)
	switch {
	case w.Err == nil:
		e.guard.reset(w.ID)
	case errors.Is(w.Err, lifecycle.ErrCapacity), errors.Is(w.Err, lifecycle.ErrUnavailable),
		errors.Is(w.Err, lifecycle.ErrStoreUnavailable):
		// The host, not the sandbox: no backoff for it.
	default:
		e.guard.failed(w.ID, time.Now())
	}
	if w.Err != nil {
		// Visitors see only a reason code; the engine's words are here
		// and in the record, behind the management API.
		e.log.Warn("wake failed", zap.String("id", w.ID), zap.String("from", string(w.From)), zap.Error(w.Err))
	}
}

// Destruct closes the engine: wakes in flight are cancelled and awaited,
// activity is flushed, the store closed.
func (e *engine) Destruct() error {
	e.ready.Store(false)
	metricsEngine.CompareAndSwap(e, nil)
	// The cluster goes first: the lease is revoked while the store can
	// still answer the publisher's last reads.
	err := errors.Join(e.closeCluster(), e.core.Close())
	e.log.Info("sandwake engine stopped")
	return err
}

// clusterFigures holds the capacity limits of the current config, read by
// the cluster's lease keeper and by placement.
type clusterFigures struct {
	maxResident  atomic.Int64
	minFreeBytes atomic.Uint64
	// defaultMemMB is the memory a create without one is placed with.
	defaultMemMB atomic.Int64
}

// nodeName is the node a local sandbox belongs to: the cluster's node name,
// else the instance name.
func (e *engine) nodeName() string {
	if e.cluster != nil {
		return e.cluster.c.Self()
	}
	return e.instance
}
