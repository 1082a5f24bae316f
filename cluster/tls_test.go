package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestEtcdRequiresAClientCertificate: the test clusters run etcd with TLS
// and client-certificate auth, so a client without a certificate of the
// cluster's CA (none at all, or one of another CA) gets nothing, and a node
// with one works.
func TestEtcdRequiresAClientCertificate(t *testing.T) {
	ec := etcdtest.Start(t, 1)
	for _, ep := range ec.Endpoints() {
		if !strings.HasPrefix(ep, "https://") {
			t.Fatalf("endpoint %s is not https", ep)
		}
	}
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(ec.Certs.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(pem)
	stranger, err := tls.LoadX509KeyPair(ec.Certs.OtherCertFile, ec.Certs.OtherKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*tls.Config{
		"no client certificate":           {RootCAs: pool},
		"a certificate of another CA":     {RootCAs: pool, Certificates: []tls.Certificate{stranger}},
		"no CA to verify the server with": {Certificates: []tls.Certificate{stranger}},
	} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: ec.Endpoints(), DialTimeout: time.Second, TLS: cfg, Logger: zap.NewNop()})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = cli.Put(ctx, "/probe", "x")
			cancel()
			cli.Close()
		}
		if err == nil {
			t.Errorf("%s: the put went through", name)
		}
	}
	c := startNode(t, ec.Endpoints(), testPrefix(), "node-a", newMemSource())
	if err := c.Health(); err != nil {
		t.Errorf("a node with the cluster's client certificate: %v", err)
	}
}

// TestEtcdUsernameAndPassword: with etcd's auth on and a role limited to
// the cluster's prefix (the recipe in docs/security.md), a node with the
// role's user works, and a client without a password is refused.
func TestEtcdUsernameAndPassword(t *testing.T) {
	ec := etcdtest.Start(t, 1)
	prefix := testPrefix()
	admin, err := clientv3.New(clientv3.Config{Endpoints: ec.Endpoints(), DialTimeout: 2 * time.Second, TLS: etcdtest.ClientTLS(ec.Endpoints()), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "sandwake"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "sandwake", prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, "sandwake", "node-pw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "sandwake", "sandwake"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth setup step %d: %v", i, err)
		}
	}
	c, err := New(Config{
		Endpoints: ec.Endpoints(), Node: "node-a", Advertise: "node-a.test:8080", Peers: testPeers(t, "node-a"),
		Secret: []byte("s3cret"), Prefix: prefix, LeaseTTL: testTTL, Logger: zaptest.NewLogger(t),
		TLS: etcdtest.ClientTLS(ec.Endpoints()), Username: "sandwake", Password: "node-pw",
	}, newMemSource())
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	if err := c.Start(sctx); err != nil {
		t.Fatalf("a node with the prefix role: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// The role reaches its prefix only.
	user, err := clientv3.New(clientv3.Config{Endpoints: ec.Endpoints(), DialTimeout: 2 * time.Second, TLS: etcdtest.ClientTLS(ec.Endpoints()),
		Username: "sandwake", Password: "node-pw", Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	if _, err := user.Put(ctx, "/elsewhere/x", "y"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a put outside the prefix: %v, want permission denied", err)
	}
}

// TestPlaintextEtcdStillWorks: StartPlaintext serves http:// endpoints (the
// gateway accepts them only with insecure_plaintext).
func TestPlaintextEtcdStillWorks(t *testing.T) {
	ec := etcdtest.StartPlaintext(t, 1)
	if !strings.HasPrefix(ec.Endpoints()[0], "http://") || etcdtest.ClientTLS(ec.Endpoints()) != nil {
		t.Fatalf("endpoints %v", ec.Endpoints())
	}
	c := startNode(t, ec.Endpoints(), testPrefix(), "node-a", newMemSource())
	if err := c.Health(); err != nil {
		t.Error(err)
	}
}

// TestForgedRegistrationsAreIgnored: a node key written by anyone but
// that node is neither live nor placed on: one without a lease (a node
// holds its key with its lease), and leased ones whose certificate is
// missing, of another CA, another node's, or not covering the advertised
// address. A node's real registration has its published capacity read
// bounded.
func TestForgedRegistrationsAreIgnored(t *testing.T) {
	ec := etcdtest.Start(t, 1)
	prefix := testPrefix()
	a := startNode(t, ec.Endpoints(), prefix, "node-a", newMemSource())
	cli := newClient(t, ec.Endpoints())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, otherKey, err := NewCA("other", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	register := func(name, advertise string, certs [][]byte, leased bool) {
		t.Helper()
		rec, err := json.Marshal(nodeRecord{Name: name, Advertise: advertise, Certs: certs,
			Capacity: Capacity{MaxResident: 1_000_000_000, FreeMemoryMB: 1_000_000_000_000}})
		if err != nil {
			t.Fatal(err)
		}
		var opts []clientv3.OpOption
		if leased {
			opts = append(opts, clientv3.WithLease(lease.ID))
		}
		if _, err := cli.Put(ctx, prefix+"nodes/"+name, string(rec), opts...); err != nil {
			t.Fatal(err)
		}
	}
	chain := func(cr *Credentials) [][]byte { return cr.Cert.Certificate }
	register("unleased", "127.0.0.1:1", chain(testCreds(t, "unleased")), false)
	register("nocert", "127.0.0.1:1", nil, true)
	register("stranger", "127.0.0.1:1", chain(issueCreds(t, otherCA, otherKey, "stranger", "127.0.0.1")), true)
	register("impostor", "127.0.0.1:1", chain(testCreds(t, "node-a")), true)
	register("elsewhere", "10.9.9.9:1", chain(testCreds(t, "elsewhere", "127.0.0.1")), true)
	// Last, with a good certificate: once it is seen, so were the others.
	register("greedy", "127.0.0.1:1", chain(testCreds(t, "greedy", "127.0.0.1")), true)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		n, _ := a.Node("greedy")
		return n.Live, "the leased registration with a good certificate seen"
	})
	for _, name := range []string{"unleased", "nocert", "stranger", "impostor", "elsewhere"} {
		if n, ok := a.Node(name); ok && n.Live {
			t.Errorf("registration %s is live: %+v", name, n)
		}
	}
	g, _ := a.Node("greedy")
	if g.Capacity.MaxResident > MaxPublishedResident || g.Capacity.FreeMemoryMB > MaxPublishedMemoryMB {
		t.Errorf("published capacity not bounded: %+v", g.Capacity)
	}
	for range 20 {
		n, err := a.Place(64, "greedy")
		if err != nil {
			t.Fatal(err)
		}
		if n.Name != "node-a" {
			t.Fatalf("a create was placed on %s", n.Name)
		}
	}
}
