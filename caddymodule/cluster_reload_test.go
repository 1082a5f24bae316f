package caddymodule_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sandwake/sandwake/caddymodule"
	"github.com/sandwake/sandwake/cluster/clustertest"
)

// TestClusterBlockReloadRefused: a reload that would join a running single
// host to a cluster is refused with a message saying to restart (Caddy
// keeps the running config), instead of being taken while the engine goes
// on as before; the engine's reference is given back, and a reload that
// leaves the cluster block alone still works.
func TestClusterBlockReloadRefused(t *testing.T) {
	h := newHarness(t, "")
	f := clustertest.NewPKI(t).WriteNode(t, t.TempDir(), "reload-n1", "127.0.0.1")
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(h.Caddyfile(fmt.Sprintf(`cluster {
			etcd http://127.0.0.1:1
			insecure_plaintext
			node reload-n1
			peer_listen 127.0.0.1:1
			peer_ca_file %[1]s
			peer_cert_file %[2]s
			peer_key_file %[3]s
			secret 0123456789abcdef
		}`, f.CA, f.Cert, f.Key))), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = caddy.Load(cfg, true)
	if err == nil || !strings.Contains(err.Error(), "a cluster block was added") || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("reload adding a cluster block: %v, want it refused, saying to restart", err)
	}
	if n := caddymodule.EngineReferences(filepath.Join(h.Dir, "sandwake")); n != 1 {
		t.Fatalf("the engine has %d references after the refused reload, want 1 (the running config's)", n)
	}
	var ready struct {
		Node   string            `json:"node"`
		Checks map[string]string `json:"checks"`
	}
	if code := h.API("GET", "/v1/readyz", nil, &ready); code != 200 || ready.Node == "reload-n1" || ready.Checks["cluster"] != "" {
		t.Fatalf("after the refused reload: readyz %d %+v, want the single host still serving", code, ready)
	}
	h.Load("")
	h.WaitReady()
}
