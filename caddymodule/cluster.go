package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/lifecycle"
)

// ClusterConfig is the cluster block of the sandwake app: the gateway joins a
// cluster of nodes sharing one sandbox catalog in etcd, and serves every
// sandbox of the cluster (see the README, "Cluster"). Without it the gateway
// is a single host and nothing of the cluster runs.
type ClusterConfig struct {
	// Etcd are the client URLs of the etcd cluster, e.g.
	// http://10.0.0.5:2379. Required.
	Etcd []string `json:"etcd,omitempty"`
	// Node is this node's name, unique in the cluster; it is also the
	// gateway's instance name (an instance option, if given, must equal
	// it). 1-63 characters of [a-z0-9_.-]. Default: the host name,
	// lowercased.
	Node string `json:"node,omitempty"`
	// Advertise is host:port of this node's preview listener (plain
	// HTTP) as the other nodes dial it to forward preview requests.
	// Required.
	Advertise string `json:"advertise,omitempty"`
	// AdvertiseAPI is host:port of this node's management API listener
	// (plain HTTP) as the other nodes dial it to forward API calls.
	// Required.
	AdvertiseAPI string `json:"advertise_api,omitempty"`
	// Secret signs node-to-node requests; every node has the same, at
	// least 16 bytes once placeholders such as
	// {env.SANDWAKE_CLUSTER_SECRET} are replaced. Required.
	Secret string `json:"secret,omitempty"`
	// Prefix is the key prefix of the cluster in etcd. Default: /sandwake/.
	Prefix string `json:"prefix,omitempty"`
	// LeaseTTL is how long a node may be silent before the others take
	// it for lost. Default: 10s.
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`

	secret []byte
}

// provision fills the cluster block's defaults and makes the node name the
// instance name.
func (c *ClusterConfig) provision(a *App) error {
	c.secret = []byte(caddy.NewReplacer().ReplaceKnown(c.Secret, ""))
	if c.Node == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("sandwake: cluster: node is not set and the host name cannot be read: %w", err)
		}
		c.Node = strings.ToLower(host)
	}
	if c.Prefix == "" {
		c.Prefix = cluster.DefaultPrefix
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = caddy.Duration(cluster.DefaultLeaseTTL)
	}
	if a.Instance != "" && a.Instance != c.Node {
		return fmt.Errorf("sandwake: instance %q and cluster node %q differ: a node's name is its instance name (drop instance, or make them equal)", a.Instance, c.Node)
	}
	a.Instance = c.Node
	return nil
}

// validate checks the cluster block once provisioned.
func (c *ClusterConfig) validate() error {
	if len(c.Etcd) == 0 {
		return errors.New("sandwake: cluster: etcd needs at least one client URL")
	}
	for _, ep := range c.Etcd {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("sandwake: cluster: etcd %q is not an http(s) URL", ep)
		}
	}
	if !validInstance(c.Node) {
		return fmt.Errorf("sandwake: cluster: node %q: want 1-63 characters of [a-z0-9_.-] starting with a letter or digit", c.Node)
	}
	for name, addr := range map[string]string{"advertise": c.Advertise, "advertise_api": c.AdvertiseAPI} {
		if addr == "" {
			return fmt.Errorf("sandwake: cluster: %s is required (host:port the other nodes dial)", name)
		}
		if host, port, err := net.SplitHostPort(addr); err != nil || host == "" || port == "" {
			return fmt.Errorf("sandwake: cluster: %s %q is not host:port", name, addr)
		}
	}
	if c.Secret == "" {
		return errors.New("sandwake: cluster: secret is required (the same on every node)")
	}
	if len(c.secret) < 16 {
		return errors.New("sandwake: cluster: secret must be at least 16 bytes once placeholders are replaced")
	}
	if c.LeaseTTL < caddy.Duration(time.Second) {
		return errors.New("sandwake: cluster: lease_ttl must be at least 1s")
	}
	return nil
}

// clusterSource is what the cluster reads of its own node: the manager's
// records and the node's room.
type clusterSource struct {
	e *engine
}

func (s clusterSource) Get(id string) (lifecycle.Record, error) { return s.e.mgr.Get(id) }

func (s clusterSource) List(state lifecycle.State) ([]lifecycle.Record, error) {
	return s.e.mgr.List(state)
}

func (s clusterSource) Capacity() cluster.Capacity {
	resident, reserved := s.e.mgr.Resident()
	c := cluster.Capacity{
		Resident:        resident + reserved,
		MaxResident:     int(s.e.maxResident.Load()),
		MinFreeMemoryMB: int64(s.e.minFreeBytes.Load() >> 20),
	}
	if avail, err := lifecycle.HostMemAvailable(); err == nil {
		c.FreeMemoryMB = int64(avail >> 20)
	}
	return c
}

// clusterState is the engine's part in a cluster; nil in single-host mode.
type clusterState struct {
	c *cluster.Cluster
	// remote fans the catalog changes of other nodes' sandboxes out to
	// the API's event streams.
	remote *remoteEvents
	// transport carries forwarded API calls to the other nodes.
	transport *http.Transport
	// upstreams caches each node address's reverse_proxy upstream
	// (string → *upstreamSet).
	upstreams sync.Map
}

// joinCluster builds the engine's cluster client (contacting nothing) when
// the config has a cluster block. It runs before the manager starts, so that
// no change escapes the publisher.
func (e *engine) joinCluster(a *App) error {
	if a.Cluster == nil {
		return nil
	}
	cc := a.Cluster
	c, err := cluster.New(cluster.Config{
		Endpoints: cc.Etcd, Node: cc.Node, Advertise: cc.Advertise, AdvertiseAPI: cc.AdvertiseAPI,
		Secret: cc.secret, Prefix: cc.Prefix, LeaseTTL: time.Duration(cc.LeaseTTL),
		Logger: e.log.Named("cluster"),
	}, clusterSource{e: e})
	if err != nil {
		return fmt.Errorf("sandwake: cluster: %w", err)
	}
	e.applyCapacity(a)
	cs := &clusterState{
		c:      c,
		remote: newRemoteEvents(c.Self()),
		transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
		},
	}
	c.Watch(cs.remote.observe)
	e.cluster = cs
	joined := *cc
	e.clusterCfg = &joined
	return nil
}

// clusterChanges says how cluster block next differs from prev, the one the
// engine joined with ("" when they are the same). The membership is fixed
// when the engine opens, which a reload does not do.
func clusterChanges(prev, next *ClusterConfig) string {
	switch {
	case prev == nil && next == nil:
		return ""
	case prev == nil:
		return "a cluster block was added"
	case next == nil:
		return "the cluster block was removed"
	}
	var changed []string
	for _, f := range []struct {
		name string
		same bool
	}{
		{"etcd", slices.Equal(prev.Etcd, next.Etcd)},
		{"node", prev.Node == next.Node},
		{"advertise", prev.Advertise == next.Advertise},
		{"advertise_api", prev.AdvertiseAPI == next.AdvertiseAPI},
		{"secret", bytes.Equal(prev.secret, next.secret)},
		{"prefix", prev.Prefix == next.Prefix},
		{"lease_ttl", prev.LeaseTTL == next.LeaseTTL},
	} {
		if !f.same {
			changed = append(changed, f.name)
		}
	}
	if len(changed) == 0 {
		return ""
	}
	return "cluster " + strings.Join(changed, ", ") + " changed"
}

// startCluster joins the cluster once the manager runs. With etcd down the
// node still starts: readyz says why, and the cluster keeps retrying.
func (e *engine) startCluster() error {
	if e.cluster == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.cluster.c.Start(ctx); err != nil && !errors.Is(err, cluster.ErrEtcd) {
		return fmt.Errorf("sandwake: starting cluster membership: %w", err)
	}
	if err := e.cluster.c.Health(); err != nil {
		e.log.Warn("joined the cluster without etcd (routes and local wakes work; creates wait for etcd)", zap.Error(err))
	} else {
		e.log.Info("joined the cluster", zap.String("node", e.cluster.c.Self()))
	}
	return nil
}

// closeCluster leaves the cluster (the lease is revoked: other nodes see
// this node gone at once) and stops forwarding.
func (e *engine) closeCluster() error {
	if e.cluster == nil {
		return nil
	}
	err := e.cluster.c.Close()
	e.cluster.remote.close()
	e.cluster.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("leaving the cluster: %w", err)
	}
	return nil
}

// applyCapacity publishes the config's limits to what the node registers.
func (e *engine) applyCapacity(a *App) {
	e.maxResident.Store(int64(*a.MaxResident))
	e.minFreeBytes.Store(a.minFreeBytes)
	e.defaultMemMB.Store(a.defaultMemMB)
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
