package caddymodule

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster/clustertest"
	"github.com/sandwake/sandwake/cluster/peer"
	"github.com/sandwake/sandwake/gateway"
)

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

	prev := gateway.Current()
	t.Cleanup(func() { gateway.SetCurrent(prev) })
	gateway.SetCurrent(nil)
	for _, n := range names() {
		if slices.Contains(gauges, n) {
			t.Fatalf("%s reported without an engine", n)
		}
	}

	c := clustertest.Node(t, "n1")
	e := &gateway.Gateway{Cluster: peer.NewNode(c, nil, zap.NewNop(), nil)}
	// The collector reads only the cluster: a bare engine will do, but
	// the states collector needs a manager, so it is left out here.
	reg := prometheus.NewRegistry()
	reg.MustRegister(peer.Collectors(currentNode)...)
	gateway.SetCurrent(e)
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
