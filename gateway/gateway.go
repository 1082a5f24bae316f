package gateway

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sandwake/sandwake/cluster/peer"
	core "github.com/sandwake/sandwake/engine"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/lifecycle"
)

// Settings are the per-config values the request path reads; a reload swaps
// them atomically.
type Settings struct {
	Domain      string
	HoldTimeout time.Duration
	// MaxOpen is max_open_per_sandbox (0: no cap).
	MaxOpen    int64
	PreviewURL string
	// PreviewSecret signs preview tokens (configured, or the stored one).
	PreviewSecret []byte
	RobotsTxt     bool
	// XRobotsTag is the X-Robots-Tag header value (nil: none), a full
	// slice (len == cap) shared by every response.
	XRobotsTag []string
}

// PreviewURLOf is the user-facing URL of sandbox id's port.
func (s *Settings) PreviewURLOf(id string, port int) string {
	return strings.Replace(s.PreviewURL, "*", "s-"+id+"-"+strconv.Itoa(port), 1) + "/"
}

// EngineName names the container engine sandboxes run on, "docker" or
// "kubernetes" (readyz names its check after it); "docker" before the
// engine is open.
func (g *Gateway) EngineName() string {
	if g != nil && g.Core != nil && g.Core.Kind() == core.KindKubernetes {
		return core.KindKubernetes
	}
	return core.KindDocker
}

// Gateway is the running gateway: the long-lived runtime shared by every
// config with the same storage directory, and the request path's state
// (caddymodule opens it; preview and api serve from it).
type Gateway struct {
	// Core is the store, runtime and manager (Mgr is Core.Manager).
	Core    *core.Engine
	Mgr     *lifecycle.Manager
	Routes  *RouteCache
	Log     *zap.Logger
	Ready   atomic.Bool
	Current atomic.Pointer[Settings]
	Guard   *WakeGuard
	Streams *StreamLimiter
	// StoredSecret is the preview secret kept in the store, used when no
	// preview_secret is configured.
	StoredSecret []byte

	DockerHost, UpstreamMode, Network string
	// Upstreams is the upstream mode in force (direct, published or
	// network), UpstreamsWhy why: readyz and the start-up log say them.
	Upstreams, UpstreamsWhy string

	// Instance is the gateway's instance name (configured or kept).
	Instance string
	// StoreWarning, when set, says the store looks lost (readyz shows it).
	StoreWarning string
	// EgressUnenforced: the operator turned the egress firewall off.
	EgressUnenforced bool
	// EgressCaveat, when set, qualifies readyz's egress "ok": what the
	// gateway cannot see of the enforcement (NetworkPolicies need a
	// network plugin that enforces them).
	EgressCaveat string
	// Clients are the per-client wake and hold budgets of the preview path.
	Clients *ClientLimits
	// Isolation is what the engine applies to sandboxes (readyz shows it).
	Isolation IsolationState

	// Cluster is the node's part in a cluster, nil on a single host.
	Cluster *peer.Node
	// Limits are the capacity limits of the current config the node
	// registers.
	peer.Limits
}

// Changed is the manager's change hook: the route is dropped from the cache
// and, in a cluster, the sandbox queued for publishing.
func (e *Gateway) Changed(id string) {
	e.Routes.invalidate(id)
	if e.Cluster != nil {
		e.Cluster.Changed(id)
	}
}

// ObserveWake is the manager's wake hook: metrics, the failing-wake
// backoff, and the log line with the engine's words.
func (e *Gateway) ObserveWake(w lifecycle.WakeResult) {
	observeWake(w)
	switch {
	case w.Err == nil:
		e.Guard.Reset(w.ID)
	case errors.Is(w.Err, lifecycle.ErrCapacity), errors.Is(w.Err, lifecycle.ErrUnavailable),
		errors.Is(w.Err, lifecycle.ErrStoreUnavailable):
		// The host, not the sandbox: no backoff for it.
	default:
		e.Guard.failed(w.ID, time.Now())
	}
	if w.Err != nil {
		// Visitors see only a reason code; the engine's words are here
		// and in the record, behind the management API.
		e.Log.Warn("wake failed", zap.String("id", w.ID), zap.String("from", string(w.From)), zap.Error(w.Err))
	}
}

// Close closes the gateway: wakes in flight are cancelled and awaited,
// activity is flushed, the store closed.
func (e *Gateway) Close() error {
	e.Ready.Store(false)
	metricsEngine.CompareAndSwap(e, nil)
	// The cluster goes first: the lease is revoked while the store can
	// still answer the publisher's last reads.
	var cerr error
	if e.Cluster != nil {
		cerr = e.Cluster.Close()
	}
	err := errors.Join(cerr, e.Core.Close())
	e.Log.Info("sandwake engine stopped")
	return err
}

// NodeName is the node a local sandbox belongs to: the cluster's node name,
// else the instance name.
func (e *Gateway) NodeName() string {
	if e.Cluster != nil {
		return e.Cluster.Self()
	}
	return e.Instance
}
