package preview

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/cluster/clustertest"
	"github.com/sandwake/sandwake/cluster/peer"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// fakePeer is a peer listener of a test: TLS with a node's credentials,
// recording what it is sent.
type fakePeer struct {
	srv      *httptest.Server
	mu       sync.Mutex
	requests []*http.Request
}

func newFakePeer(t *testing.T, peers *cluster.PeerTLS) *fakePeer {
	f := &fakePeer{}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Clone(context.Background()))
		f.mu.Unlock()
		w.Write([]byte(`{"id":"x"}`))
	}))
	f.srv.TLS = peers.ServerConfig()
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakePeer) addr() string { return f.srv.Listener.Addr().String() }

func (f *fakePeer) seen() []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.requests...)
}

// countingListener accepts connections and counts them, answering nothing.
func countingListener(t *testing.T) (addr string, accepted *atomic.Int32) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int32)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), accepted
}

// TestForwardOverMutualTLS: with a real etcd, a node forwards a preview
// request and an API call to the owner's peer listener over mutual TLS:
// its own certificate as client certificate, signed, the visitor's
// address and scheme in X-Forwarded-*, the API call without the caller's
// Authorization. Nothing at all goes to an address a forged registration
// names, nor past the handshake to a listener that proves to be another
// node than the one forwarded to: the visitor gets 503 host_unavailable.
func TestForwardOverMutualTLS(t *testing.T) {
	ec := etcdtest.Start(t, 1)
	b := make([]byte, 4)
	rand.Read(b)
	prefix := "/sw-peer-" + hex.EncodeToString(b) + "/"
	pki := clustertest.NewPKI(t)
	const secret = "peer-test-secret-0123456789"
	start := func(name, advertise string, peers *cluster.PeerTLS) *cluster.Cluster {
		t.Helper()
		c, err := cluster.New(cluster.Config{Endpoints: ec.Endpoints(), Node: name, Advertise: advertise, Peers: peers,
			Secret: []byte(secret), Prefix: prefix, LeaseTTL: 5 * time.Second, TLS: etcdtest.ClientTLS(ec.Endpoints()),
			Logger: zaptest.NewLogger(t).Named(name)}, clustertest.NopSource{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	n1Peers := pki.Peers(t, "n1", "127.0.0.1")
	n1 := start("n1", "127.0.0.1:1", n1Peers)
	n2Peers := pki.Peers(t, "n2", "127.0.0.1")
	owner := newFakePeer(t, n2Peers)
	n2 := start("n2", owner.addr(), n2Peers)
	// A forged registration (leased, with n2's real certificate) naming a
	// listener of the test.
	trap, accepted := countingListener(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: ec.Endpoints(), TLS: etcdtest.ClientTLS(ec.Endpoints()), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := json.Marshal(map[string]any{"name": "evil", "advertise": trap, "certs": n2Peers.Current().Cert.Certificate,
		"capacity": map[string]any{"max_resident": 1000}})
	if _, err := cli.Put(ctx, prefix+"nodes/evil", string(forged), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	// n4 is registered as it should be, but the listener at its address
	// is n3's: a node, of the cluster's CA, but not n4.
	impostor := newFakePeer(t, pki.Peers(t, "n3", "127.0.0.1"))
	start("n4", impostor.addr(), pki.Peers(t, "n4", "127.0.0.1"))
	// The watch applies changes in order: once n4's registration is
	// seen, evil's (put before it) was judged too.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		n2i, _ := n1.Node("n2")
		n4i, _ := n1.Node("n4")
		return n2i.Live && n4i.Live, "n1 sees n2 and n4 live"
	})
	if n, _ := n1.Node("evil"); n.Live {
		t.Fatalf("the forged registration is live: %+v", n)
	}

	e := &gateway.Gateway{Log: zaptest.NewLogger(t), Cluster: peer.NewNode(n1, n1Peers, zaptest.NewLogger(t), nil)}
	g := &Handler{logger: zaptest.NewLogger(t)}
	visitor := func() *http.Request {
		r := httptest.NewRequest("GET", "http://s-abc-8080.preview.localhost/page?q=1", nil)
		r.RemoteAddr = "203.0.113.7:5555"
		r.Header.Set("Authorization", "Bearer preview-token")
		return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.TrustedProxyVarKey: false}))
	}
	api := func() *http.Request {
		r := httptest.NewRequest("GET", "http://127.0.0.1:2019/v1/sandboxes/abc", nil)
		r.Header.Set("Authorization", "Bearer operator-token")
		return r
	}

	// The owner.
	w := httptest.NewRecorder()
	if err := g.forwardPreview(w, visitor(), e, &gateway.Settings{}, cluster.Entry{ID: "abc", Node: "n2"}, 8080); err != nil || w.Code != 200 {
		t.Fatalf("preview to n2: %d %s %v", w.Code, w.Body, err)
	}
	w = httptest.NewRecorder()
	e.Cluster.ForwardAPI(w, api(), "n2", "sandbox abc lives on node n2", "admin;", nil)
	if w.Code != 200 {
		t.Fatalf("API call to n2: %d %s", w.Code, w.Body)
	}
	got := owner.seen()
	if len(got) != 2 {
		t.Fatalf("n2 got %d requests, want 2", len(got))
	}
	for i, r := range got {
		if from, ok := cluster.PeerNode(*r.TLS); !ok || from != "n1" {
			t.Errorf("request %d: client certificate of %q, want n1's", i, from)
		}
		if signer, ok, err := n2.Verify(r); !ok || err != nil || signer != "n1" {
			t.Errorf("request %d: signature %q %v %v, want n1's", i, signer, ok, err)
		}
	}
	if p := got[0]; p.Host != "s-abc-8080.preview.localhost" || p.URL.RequestURI() != "/page?q=1" || p.Header.Get("X-Forwarded-For") != "203.0.113.7" ||
		p.Header.Get("X-Forwarded-Proto") != "http" || p.Header.Get("Authorization") != "Bearer preview-token" {
		t.Errorf("preview request as the owner got it: host %q uri %q headers %v", p.Host, p.URL.RequestURI(), p.Header)
	}
	if a := got[1]; a.Host != peer.APIHost || a.URL.Path != "/v1/sandboxes/abc" || a.Header.Get("Authorization") != "" {
		t.Errorf("API call as the owner got it: host %q path %q Authorization %q, want %s and no token", a.Host, a.URL.Path, a.Header.Get("Authorization"), peer.APIHost)
	}

	// The impostor and the forged registration: nothing sent.
	for _, node := range []string{"n4", "evil", "nobody"} {
		w := httptest.NewRecorder()
		if err := g.forwardPreview(w, visitor(), e, &gateway.Settings{}, cluster.Entry{ID: "abc", Node: node}, 8080); err != nil ||
			w.Code != 503 || !strings.Contains(w.Body.String(), "host_unavailable") {
			t.Errorf("preview to %s: %d %s %v, want 503 host_unavailable", node, w.Code, w.Body, err)
		}
		w = httptest.NewRecorder()
		e.Cluster.ForwardAPI(w, api(), node, "sandbox abc lives on node "+node, "admin;", nil)
		if w.Code != 503 || !strings.Contains(w.Body.String(), "host_unavailable") {
			t.Errorf("API call to %s: %d %s, want 503 host_unavailable", node, w.Code, w.Body)
		}
	}
	if n := len(impostor.seen()); n != 0 {
		t.Errorf("the listener proving to be n3 got %d requests meant for n4", n)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the address of the forged registration got %d connections", n)
	}
}
