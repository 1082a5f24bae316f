package cli

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandwake/sandwake/cluster"
)

// TestClusterPKICommands: `cluster ca` makes a CA (key 0600) and refuses to
// replace one; `cluster cert` issues a node certificate the gateway loads
// as the node's credentials, replaces it on renewal, and refuses bad
// input with one line.
func TestClusterPKICommands(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	caDir, nodeDir := filepath.Join(dir, "ca"), filepath.Join(dir, "n1")
	runCLI(t, ctx, "cluster", "ca", "--out", caDir).ok(t, "cluster ca")
	for name, want := range map[string]os.FileMode{"ca.key": 0o600, "ca.crt": 0o644} {
		fi, err := os.Stat(filepath.Join(caDir, name))
		if err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: %v mode %v, want %v", name, err, fi.Mode().Perm(), want)
		}
	}
	runCLI(t, ctx, "cluster", "ca", "--out", caDir).failed(t, "cluster ca over an existing CA", "exists")

	issue := func(days string) *cluster.Credentials {
		t.Helper()
		runCLI(t, ctx, "cluster", "cert", "--node", "n1", "--addr", "10.0.0.11,127.0.0.1", "--addr", "n1.internal",
			"--ca", caDir, "--out", nodeDir, "--days", days).ok(t, "cluster cert")
		if fi, err := os.Stat(filepath.Join(nodeDir, "n1.key")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("n1.key: %v %v, want mode 0600", err, fi.Mode())
		}
		cr, err := cluster.LoadCredentials(filepath.Join(caDir, "ca.crt"), filepath.Join(nodeDir, "n1.crt"), filepath.Join(nodeDir, "n1.key"), time.Now())
		if err != nil {
			t.Fatalf("the gateway refuses the issued certificate: %v", err)
		}
		return cr
	}
	cr := issue("30")
	if cr.Node != "n1" {
		t.Fatalf("node %q", cr.Node)
	}
	for _, h := range []string{"10.0.0.11", "127.0.0.1", "n1.internal"} {
		if err := cr.Cert.Leaf.VerifyHostname(h); err != nil {
			t.Errorf("not valid for %s: %v", h, err)
		}
	}
	if left := time.Until(cr.Cert.Leaf.NotAfter); left > 31*24*time.Hour || left < 29*24*time.Hour {
		t.Errorf("valid for %s, want 30 days", left)
	}
	renewed := issue("60")
	if renewed.Cert.Leaf.SerialNumber.Cmp(cr.Cert.Leaf.SerialNumber) == 0 {
		t.Error("the renewal did not replace the certificate")
	}

	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no node", []string{"--addr", "10.0.0.1", "--ca", caDir, "--out", nodeDir}, "--node"},
		{"bad node", []string{"--node", "Node/1", "--addr", "10.0.0.1", "--ca", caDir, "--out", nodeDir}, "--node"},
		{"no addr", []string{"--node", "n2", "--ca", caDir, "--out", nodeDir}, "--addr"},
		{"addr with port", []string{"--node", "n2", "--addr", "10.0.0.1:7443", "--ca", caDir, "--out", nodeDir}, "without a port"},
		{"no CA", []string{"--node", "n2", "--addr", "10.0.0.1", "--ca", filepath.Join(dir, "none"), "--out", nodeDir}, "reading the CA"},
		{"zero days", []string{"--node", "n2", "--addr", "10.0.0.1", "--ca", caDir, "--out", nodeDir, "--days", "0"}, "--days"},
	} {
		runCLI(t, ctx, append([]string{"cluster", "cert"}, tt.args...)...).failed(t, tt.name, tt.want)
	}
}
