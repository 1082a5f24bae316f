package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testCA is the cluster CA of this package's tests.
var testCA = sync.OnceValues(func() ([]byte, []byte) {
	cert, key, err := NewCA("sandwake test CA", time.Now(), 24*time.Hour)
	if err != nil {
		panic(err)
	}
	return cert, key
})

// testCreds issues node's credentials of the test CA for hosts (default:
// <node>.test, the address the package's test nodes advertise, and
// 127.0.0.1).
func testCreds(t testing.TB, node string, hosts ...string) *Credentials {
	t.Helper()
	caCert, caKey := testCA()
	return issueCreds(t, caCert, caKey, node, hosts...)
}

func issueCreds(t testing.TB, caCert, caKey []byte, node string, hosts ...string) *Credentials {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{node + ".test", "127.0.0.1"}
	}
	cert, key, err := IssueNodeCert(caCert, caKey, NodeCertRequest{Node: node, Hosts: hosts}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string][]byte{"ca.crt": caCert, "node.crt": cert, "node.key": key}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cr, err := LoadCredentials(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return cr
}

// testPeers is testCreds held for a cluster.
func testPeers(t testing.TB, node string, hosts ...string) *PeerTLS {
	t.Helper()
	return NewPeerTLS(testCreds(t, node, hosts...))
}

// offlineNode is a cluster client of node that is never started.
func offlineNode(t testing.TB, node string) *Cluster {
	t.Helper()
	c, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}, Node: node, Advertise: node + ".test:8080",
		Peers: testPeers(t, node), Secret: []byte("x")}, newMemSource())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestIssuedCertificates: the CA signs node certificates only; a node
// certificate names its node in a URI SAN, covers its addresses as IP or
// DNS SANs, serves and dials, and does not outlive the CA.
func TestIssuedCertificates(t *testing.T) {
	now := time.Now()
	caPEM, caKey, err := NewCA("ca", now, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := IssueNodeCert(caPEM, caKey, NodeCertRequest{Node: "n1", Hosts: []string{"10.0.0.11", "n1.example", "::1"}, Validity: 365 * 24 * time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	parse := func(b []byte) *x509.Certificate {
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ca, leaf := parse(caPEM), parse(certPEM)
	if !ca.IsCA || !ca.MaxPathLenZero || ca.MaxPathLen != 0 {
		t.Errorf("CA: IsCA %v MaxPathLen %d zero %v, want a CA that signs leaves only", ca.IsCA, ca.MaxPathLen, ca.MaxPathLenZero)
	}
	if name, ok := NodeName(leaf); !ok || name != "n1" || leaf.Subject.CommonName != "n1" {
		t.Errorf("node name %q %v (CN %q), want n1", name, ok, leaf.Subject.CommonName)
	}
	for _, h := range []string{"10.0.0.11", "n1.example", "::1"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("certificate does not cover %s: %v", h, err)
		}
	}
	if err := leaf.VerifyHostname("10.0.0.12"); err == nil {
		t.Error("certificate covers an address it was not issued for")
	}
	if !leaf.NotAfter.Equal(ca.NotAfter) {
		t.Errorf("node certificate until %s, CA until %s: want it capped at the CA's", leaf.NotAfter, ca.NotAfter)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{u}, CurrentTime: now}); err != nil {
			t.Errorf("usage %v: %v", u, err)
		}
	}
	for _, bad := range []NodeCertRequest{{Node: "", Hosts: []string{"10.0.0.1"}}, {Node: "a/b", Hosts: []string{"10.0.0.1"}},
		{Node: "n1"}, {Node: "n1", Hosts: []string{"10.0.0.1:80"}}} {
		if _, _, err := IssueNodeCert(caPEM, caKey, bad, now); err == nil {
			t.Errorf("IssueNodeCert(%+v) succeeded", bad)
		}
	}
	_, otherKey, _ := NewCA("other", now, time.Hour)
	if _, _, err := IssueNodeCert(caPEM, otherKey, NodeCertRequest{Node: "n1", Hosts: []string{"10.0.0.1"}}, now); err == nil || !strings.Contains(err.Error(), "does not belong") {
		t.Errorf("signing with another CA's key: %v", err)
	}
}

// TestNodeNameOfURIs: exactly one well-formed sandwake://node/ URI names a
// node.
func TestNodeNameOfURIs(t *testing.T) {
	for _, tt := range []struct {
		uris []string
		want string
	}{
		{[]string{"sandwake://node/n1"}, "n1"},
		{[]string{"spiffe://x/y", "sandwake://node/n1"}, "n1"},
		{[]string{"sandwake://node/n1", "sandwake://node/n2"}, ""},
		{[]string{"sandwake://node/"}, ""},
		{[]string{"sandwake://other/n1"}, ""},
		{[]string{"sandwake://node/n1/x"}, ""},
		{[]string{"https://node/n1"}, ""},
		{nil, ""},
	} {
		cert := &x509.Certificate{}
		for _, s := range tt.uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			cert.URIs = append(cert.URIs, u)
		}
		if got, _ := NodeName(cert); got != tt.want {
			t.Errorf("URIs %v: node %q, want %q", tt.uris, got, tt.want)
		}
	}
}

// TestLoadCredentials: a node's credentials must be of the CA given, name
// a node and hold the certificate's own key.
func TestLoadCredentials(t *testing.T) {
	caCert, caKey := testCA()
	otherCert, _, _ := NewCA("other", time.Now(), time.Hour)
	cert, key, err := IssueNodeCert(caCert, caKey, NodeCertRequest{Node: "n1", Hosts: []string{"127.0.0.1"}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, key2, _ := IssueNodeCert(caCert, caKey, NodeCertRequest{Node: "n1", Hosts: []string{"127.0.0.1"}}, time.Now())
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ca, other, crt, k, k2 := write("ca.crt", caCert), write("other.crt", otherCert), write("n1.crt", cert), write("n1.key", key), write("k2.key", key2)
	both := write("both.crt", append(append([]byte{}, otherCert...), caCert...))
	if cr, err := LoadCredentials(ca, crt, k, time.Now()); err != nil || cr.Node != "n1" {
		t.Fatalf("good credentials: %v", err)
	}
	if _, err := LoadCredentials(both, crt, k, time.Now()); err != nil {
		t.Fatalf("a bundle of the old and the new CA: %v", err)
	}
	for name, args := range map[string][3]string{
		"another CA":    {other, crt, k},
		"another key":   {ca, crt, k2},
		"missing CA":    {filepath.Join(dir, "none"), crt, k},
		"CA is not PEM": {k, crt, k},
	} {
		if _, err := LoadCredentials(args[0], args[1], args[2], time.Now()); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	if _, err := LoadCredentials(ca, crt, k, time.Now().Add(48*time.Hour)); err == nil || !errors.Is(err, ErrPeerIdentity) {
		t.Errorf("expired certificate: %v", err)
	}
}

// TestPeerTLS: over the peer TLS configurations, a node reaches another
// only if the certificate it is shown names the node it meant to reach and
// covers the address it dialled; the listener takes only clients with a
// certificate of the cluster CA naming a node; credentials replaced at run
// time (a reload) are used by the next handshake.
func TestPeerTLS(t *testing.T) {
	server := testPeers(t, "n2", "127.0.0.1")
	var served atomic.Int32
	var lastPeer atomic.Value
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		name, _ := PeerNode(*r.TLS)
		lastPeer.Store(name)
		io.WriteString(w, "ok")
	}))
	ts.TLS = server.ServerConfig()
	ts.StartTLS()
	defer ts.Close()
	_, port, _ := net.SplitHostPort(ts.Listener.Addr().String())

	get := func(client *PeerTLS, node, host string) error {
		tr := &http.Transport{TLSClientConfig: client.ClientConfig(node, host)}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://127.0.0.1:" + port + "/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	client := testPeers(t, "n1")
	if err := get(client, "n2", "127.0.0.1"); err != nil {
		t.Fatalf("n1 to n2: %v", err)
	}
	if got := lastPeer.Load(); got != "n1" {
		t.Fatalf("the listener saw node %v, want n1", got)
	}
	before := served.Load()
	// The certificate at the address is n2's: a forwarder that wants n3
	// there, or reached it under another address, sends nothing.
	if err := get(client, "n3", "127.0.0.1"); err == nil || !errors.Is(err, ErrPeerIdentity) {
		t.Errorf("n1 to n3 at n2's address: %v", err)
	}
	if err := get(client, "n2", "10.0.0.12"); err == nil || !errors.Is(err, ErrPeerIdentity) {
		t.Errorf("n1 to n2 under an address its certificate does not cover: %v", err)
	}
	// A client of another CA, or without a node name, gets nothing.
	otherCert, otherKey, _ := NewCA("other", time.Now(), time.Hour)
	stranger := NewPeerTLS(issueCreds(t, otherCert, otherKey, "n1", "127.0.0.1"))
	stranger.cur.Load().Roots = server.Current().Roots // it trusts the cluster, the cluster not it
	if err := get(stranger, "n2", "127.0.0.1"); err == nil {
		t.Error("a node certificate of another CA was accepted")
	}
	plain := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: server.Current().Roots}}}
	if resp, err := plain.Get("https://127.0.0.1:" + port + "/"); err == nil {
		resp.Body.Close()
		t.Error("a client without a certificate was served")
	}
	if n := served.Load(); n != before {
		t.Errorf("%d requests served that should not have been", n-before)
	}
	// A renewed certificate for another address, stored at run time.
	server.Store(testCreds(t, "n2", "localhost"))
	if err := get(client, "n2", "127.0.0.1"); err == nil {
		t.Error("the old certificate is still served after Store")
	}
	if err := get(client, "n2", "localhost"); err != nil {
		t.Errorf("the stored certificate: %v", err)
	}
}
