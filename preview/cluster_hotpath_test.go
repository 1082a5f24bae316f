package preview

import (
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster/clustertest"
	"github.com/sandwake/sandwake/cluster/peer"
)

// TestHotPathAllocationsInCluster: in cluster mode a request for a local
// running sandbox costs the gate a catalog lookup in memory and nothing
// allocated, like on a single host.
func TestHotPathAllocationsInCluster(t *testing.T) {
	g, _ := hotPathGate(t)
	c := clustertest.Node(t, "n1")
	g.gateway().Cluster = peer.NewNode(c, nil, zap.NewNop(), nil)
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
