package api

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/cluster/clustertest"
	"github.com/sandwake/sandwake/cluster/peer"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestClusterCheck: readyz's cluster check, with a real etcd, is ready and
// flags a node certificate that ends within a week (the test certificates
// live a day); with etcd gone it fails.
func TestClusterCheck(t *testing.T) {
	ec := etcdtest.Start(t, 1)
	peers := clustertest.NewPKI(t).Peers(t, "n1", "127.0.0.1")
	c, err := cluster.New(cluster.Config{Endpoints: ec.Endpoints(), Node: "n1", Advertise: "127.0.0.1:1", Peers: peers,
		Secret: []byte("check-test-secret-0123456789"), Prefix: "/sw-check/", LeaseTTL: 5 * time.Second,
		TLS: etcdtest.ClientTLS(ec.Endpoints()), Logger: zaptest.NewLogger(t)}, clustertest.NopSource{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := &gateway.Gateway{Log: zaptest.NewLogger(t), Cluster: peer.NewNode(c, peers, zaptest.NewLogger(t), nil)}
	if msg, ok := clusterCheck(e); !ok || !strings.Contains(msg, "ok, but the node certificate expires in") {
		t.Errorf("readyz cluster check with a certificate ending tomorrow: %q %v", msg, ok)
	}
	ec.Stop(0)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		msg, ok := clusterCheck(e)
		return !ok, fmt.Sprintf("readyz cluster check with etcd stopped: %q %v", msg, ok)
	})
}
