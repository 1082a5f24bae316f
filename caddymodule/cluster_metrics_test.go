package caddymodule

import (
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sandwake/sandwake/cluster/clustertest"
)

// TestHotPathAllocationsInCluster: in cluster mode a request for a local
// running sandbox costs the gate a catalog lookup in memory and nothing
// allocated, like on a single host.
func TestHotPathAllocationsInCluster(t *testing.T) {
	g, _ := hotPathGate(t)
	c := clustertest.Node(t, "n1")
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
