package caddymodule

import (
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/lifecycle"
)

// nopSource is a node without sandboxes, for a cluster that is never
// started.
type nopSource struct{}

func (nopSource) Get(string) (lifecycle.Record, error) {
	return lifecycle.Record{}, lifecycle.ErrNotFound
}
func (nopSource) List(lifecycle.State) ([]lifecycle.Record, error) {
	return nil, nil
}
func (nopSource) Capacity() cluster.Capacity { return cluster.Capacity{} }

// TestClusterMetrics: the cluster gauges are reported for an engine in a
// cluster and absent on a single host; the forwarded counter has its two
// kinds.
func TestClusterMetrics(t *testing.T) {
	names := func() []string {
		reg := prometheus.NewRegistry()
		if err := registerMetrics(reg); err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, mf := range mfs {
			out = append(out, mf.GetName())
		}
		return out
	}
	gauges := []string{"caddy_sandwake_cluster_nodes", "caddy_sandwake_cluster_catalog_lag_seconds",
		"caddy_sandwake_cluster_pending", "caddy_sandwake_cluster_etcd_errors_total"}

	prev := metricsEngine.Load()
	t.Cleanup(func() { metricsEngine.Store(prev) })
	metricsEngine.Store(nil)
	for _, n := range names() {
		if slices.Contains(gauges, n) {
			t.Fatalf("%s reported without an engine", n)
		}
	}

	c := testNode(t, "n1")
	e := &engine{Cluster: &clusterState{c: c}}
	// The collector reads only the cluster: a bare engine will do, but
	// the states collector needs a manager, so it is left out here.
	reg := prometheus.NewRegistry()
	reg.MustRegister(clusterCollector{currentNode}, metricForwarded)
	metricsEngine.Store(e)
	MetricForwardedPreview.Add(0)
	metricForwardedAPI.Add(0)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, mf := range mfs {
		got[mf.GetName()] = len(mf.GetMetric())
	}
	for _, g := range gauges {
		if got[g] != 1 {
			t.Fatalf("%s: %d series, want 1 (got %v)", g, got[g], got)
		}
	}
	if got["caddy_sandwake_cluster_forwarded_requests_total"] != 2 {
		t.Fatalf("forwarded requests: %d series, want preview and api (got %v)", got["caddy_sandwake_cluster_forwarded_requests_total"], got)
	}
}

// TestHotPathAllocationsInCluster: in cluster mode a request for a local
// running sandbox costs the gate a catalog lookup in memory and nothing
// allocated, like on a single host.
func TestHotPathAllocationsInCluster(t *testing.T) {
	g, _ := hotPathGate(t)
	c := testNode(t, "n1")
	g.app.engine().Cluster = &clusterState{c: c}
	r := hotRequest()
	w := httptest.NewRecorder()
	var next caddyhttp.Handler = proxyStub{t}
	allocs := testing.AllocsPerRun(1000, func() {
		if err := g.ServeHTTP(w, r, next); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("gate allocates %v times per proxied request in cluster mode, want 0", allocs)
	}
}
