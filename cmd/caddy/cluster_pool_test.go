package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestClusterPoolPlacement: two nodes share template web; only the second
// keeps a warm pool of it. A create from the template sent to the first
// node is placed on the second, which advertises an idle container, and
// claims it there (pool.hit in the answer the first node relays); the
// sandbox is then routed from either node. A create with its own id is
// placed as any create and created cold.
func TestClusterPoolPlacement(t *testing.T) {
	testenv.Docker(t)
	image := testenv.TestAppImage(t)
	bin := buildCaddy(t)
	etcd := etcdtest.Start(t, 1)
	caDir := clusterCA(t, bin)
	prefix := "/sandwake-pool-" + testenv.RunID() + "/"
	var nodes []*gateway
	var names []string
	for i, pool := range []string{"", "pool {\n\t\t\t\tmin_idle 1\n\t\t\t}"} {
		g := newGateway(t, bin, "")
		name := fmt.Sprintf("p%d-%s", i+1, testenv.RunID())
		port, cert := freePort(t), issueNodeCert(t, bin, caDir, name)
		g.configure(fmt.Sprintf(`template web {
			image %s
			ports 8080
			memory_mb 64
			%s
		}
		cluster {
			etcd %s
			etcd_ca_file %s
			etcd_cert_file %s
			etcd_key_file %s
			node %s
			%s
			secret %s
			prefix %s
			lease_ttl %s
		}`, image, pool, strings.Join(etcd.Endpoints(), " "), etcd.Certs.CAFile, etcd.Certs.ClientCertFile, etcd.Certs.ClientKey, name,
			peerBlock(caDir, port, cert), clusterSecret, prefix, clusterTTL))
		nodes, names = append(nodes, g), append(names, name)
	}
	for _, g := range nodes {
		g.start()
	}
	// The first node learns the second's idle container from its
	// registration.
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		var nl client.NodeList
		nodes[0].api("GET", "/v1/nodes", nil, &nl)
		for _, n := range nl.Nodes {
			if n.Name == names[1] && n.Live && n.Capacity.Pools["web"] == 1 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("nodes as the first node sees them: %+v", nl.Nodes)
	})
	var rec client.Sandbox
	if status, body := nodes[0].api("POST", "/v1/sandboxes", map[string]any{"template": "web"}, &rec); status != http.StatusCreated {
		t.Fatalf("create from the template via the first node: %d %s", status, body)
	}
	if rec.Node != names[1] || rec.Pool == nil || !rec.Pool.Hit || rec.Template != "web" {
		t.Fatalf("created on %s with pool %+v, want a hit on %s", rec.Node, rec.Pool, names[1])
	}
	for i, g := range nodes {
		testenv.Eventually(t, 20*time.Second, func() (bool, string) {
			resp, err := g.previewGet(rec.ID)
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == 200, fmt.Sprintf("node %d answers %d for the claimed sandbox", i+1, resp.StatusCode)
		})
	}
	var cold client.Sandbox
	id := testenv.UniqueID("pc")
	if status, body := nodes[0].api("POST", "/v1/sandboxes", map[string]any{"template": "web", "id": id}, &cold); status != http.StatusCreated {
		t.Fatalf("create from the template with an id: %d %s", status, body)
	}
	if cold.ID != id || cold.Pool == nil || cold.Pool.Hit || cold.Pool.Reason != "id" {
		t.Fatalf("create with an id: %s pool %+v", cold.ID, cold.Pool)
	}
}
