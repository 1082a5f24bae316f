package caddymodule

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestClusterChanges: what a reload would change of the cluster block the
// engine joined with.
func TestClusterChanges(t *testing.T) {
	base := func() *ClusterConfig {
		return &ClusterConfig{Etcd: []string{"http://127.0.0.1:2379"}, Node: "n1", Advertise: "127.0.0.1:80",
			AdvertiseAPI: "127.0.0.1:81", Secret: "{env.X}", Prefix: "/sandwake/", LeaseTTL: caddy.Duration(10e9), secret: []byte("0123456789abcdef")}
	}
	same := base()
	same.Secret = "{env.Y}" // the same secret once resolved
	rotated := base()
	rotated.secret = []byte("fedcba9876543210")
	moved := base()
	moved.Etcd, moved.Node = []string{"http://127.0.0.1:2380"}, "n2"
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
	} {
		if got := clusterChanges(tt.prev, tt.next); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestClusterBlockReloadRefused: a reload that would join a running single
// host to a cluster is refused with a message saying to restart (Caddy
// keeps the running config), instead of being taken while the engine goes
// on as before; the engine's reference is given back, and a reload that
// leaves the cluster block alone still works.
func TestClusterBlockReloadRefused(t *testing.T) {
	h := newHarness(t, "")
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(h.caddyfile(`cluster {
			etcd http://127.0.0.1:1
			node reload-n1
			advertise 127.0.0.1:1
			advertise_api 127.0.0.1:2
			secret 0123456789abcdef
		}`)), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = caddy.Load(cfg, true)
	if err == nil || !strings.Contains(err.Error(), "a cluster block was added") || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("reload adding a cluster block: %v, want it refused, saying to restart", err)
	}
	if n, _ := engines.References(filepath.Join(h.dir, "sandwake")); n != 1 {
		t.Fatalf("the engine has %d references after the refused reload, want 1 (the running config's)", n)
	}
	var ready struct {
		Node   string            `json:"node"`
		Checks map[string]string `json:"checks"`
	}
	if code := h.api("GET", "/v1/readyz", nil, &ready); code != 200 || ready.Node == "reload-n1" || ready.Checks["cluster"] != "" {
		t.Fatalf("after the refused reload: readyz %d %+v, want the single host still serving", code, ready)
	}
	h.load("")
	h.waitReady()
}
