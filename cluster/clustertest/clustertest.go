package clustertest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/lifecycle"
)

// PKI is a throwaway cluster CA.
type PKI struct {
	CACert, CAKey []byte
}

// NewPKI makes a new cluster CA.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	cert, key, err := cluster.NewCA("sandwake test cluster CA", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &PKI{CACert: cert, CAKey: key}
}

// Files are a node's credentials written to disk.
type Files struct {
	CA, Cert, Key string
}

// WriteNode issues node's certificate for hosts and writes it, its key
// (0600) and the CA certificate into dir.
func (p *PKI) WriteNode(t testing.TB, dir, node string, hosts ...string) Files {
	t.Helper()
	cert, key, err := cluster.IssueNodeCert(p.CACert, p.CAKey, cluster.NodeCertRequest{Node: node, Hosts: hosts, Validity: 24 * time.Hour}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f := Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, node+".crt"), Key: filepath.Join(dir, node+".key")}
	for path, b := range map[string][]byte{f.CA: p.CACert, f.Cert: cert} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(f.Key, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// Peers issues node's certificate for hosts and returns its credentials.
func (p *PKI) Peers(t testing.TB, node string, hosts ...string) *cluster.PeerTLS {
	t.Helper()
	f := p.WriteNode(t, t.TempDir(), node, hosts...)
	cr, err := cluster.LoadCredentials(f.CA, f.Cert, f.Key, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return cluster.NewPeerTLS(cr)
}

// Node is a cluster client of node name that is never started (signing and
// verifying need only its config), with a CA of its own and no sandboxes.
func Node(t testing.TB, name string) *cluster.Cluster {
	t.Helper()
	c, err := cluster.New(cluster.Config{Endpoints: []string{"http://127.0.0.1:1"}, Node: name, Advertise: "127.0.0.1:7443",
		Peers: NewPKI(t).Peers(t, name, "127.0.0.1"), Secret: []byte("forward-test-secret-0123456789")}, NopSource{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// NopSource is a node without sandboxes, for a cluster that is never
// started.
type NopSource struct{}

// Get finds nothing.
func (NopSource) Get(string) (lifecycle.Record, error) {
	return lifecycle.Record{}, lifecycle.ErrNotFound
}

// List lists nothing.
func (NopSource) List(lifecycle.State) ([]lifecycle.Record, error) { return nil, nil }

// Capacity is all zero.
func (NopSource) Capacity() cluster.Capacity { return cluster.Capacity{} }
