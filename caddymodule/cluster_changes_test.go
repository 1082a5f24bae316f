package caddymodule

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestClusterChanges: what a reload would change of the cluster block the
// engine joined with.
func TestClusterChanges(t *testing.T) {
	base := func() *ClusterConfig {
		return &ClusterConfig{Etcd: []string{"http://127.0.0.1:2379"}, Node: "n1", PeerListen: "127.0.0.1:7443", Advertise: "127.0.0.1:7443",
			PeerCertFile: "/etc/n1.crt", Secret: "{env.X}", Prefix: "/sandwake/", LeaseTTL: caddy.Duration(10e9), secret: []byte("0123456789abcdef")}
	}
	same := base()
	same.Secret = "{env.Y}" // the same secret once resolved
	rotated := base()
	rotated.secret = []byte("fedcba9876543210")
	moved := base()
	moved.Etcd, moved.Node = []string{"http://127.0.0.1:2380"}, "n2"
	relistened := base()
	relistened.PeerListen, relistened.Advertise = ":7444", "127.0.0.1:7444"
	renewed := base()
	renewed.PeerCertFile = "/etc/n1-renewed.crt"
	for _, tt := range []struct {
		name       string
		prev, next *ClusterConfig
		want       string
	}{
		{"single host", nil, nil, ""},
		{"unchanged", base(), same, ""},
		{"joined", nil, base(), "a cluster block was added"},
		{"left", base(), nil, "the cluster block was removed"},
		{"secret rotated", base(), rotated, "cluster secret changed"},
		{"moved", base(), moved, "cluster etcd, node changed"},
		{"peer listener moved", base(), relistened, "cluster peer_listen, advertise changed"},
		{"certificate renewed", base(), renewed, ""},
	} {
		if got := clusterChanges(tt.prev, tt.next); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
