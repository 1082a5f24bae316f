package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"
)

func signer(t *testing.T, node, secret string, now time.Time) *Cluster {
	t.Helper()
	c, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}, Node: node, Advertise: node + ".test:8080", Peers: testPeers(t, node),
		Secret: []byte(secret)}, newMemSource())
	if err != nil {
		t.Fatal(err)
	}
	c.now = func() time.Time { return now }
	return c
}

// TestSignVerify signs an outgoing request and verifies it as the server
// receives it (request line in RequestURI).
func TestSignVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	verifier := signer(t, "node-b", "shared", now)
	outgoing := func() *http.Request {
		r, err := http.NewRequest(http.MethodPost, "http://s-abc.preview.test/path/x?q=1&r=%20", nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// received turns a signed outgoing request into the server's view.
	received := func(out *http.Request) *http.Request {
		r := httptest.NewRequest(out.Method, out.URL.RequestURI(), nil)
		r.Host = out.Host
		r.Header = out.Header.Clone()
		return r
	}
	signed := func(c *Cluster) *http.Request {
		out := outgoing()
		c.Sign(out)
		return received(out)
	}
	good := signer(t, "node-a", "shared", now)
	// withHeader is an unsigned request carrying header v.
	withHeader := func(v string) func() *http.Request {
		return func() *http.Request {
			r := received(outgoing())
			r.Header.Set(ForwardHeader, v)
			return r
		}
	}
	// resigned is a signed request whose header edit changed.
	resigned := func(edit func(string) string) func() *http.Request {
		return func() *http.Request {
			r := signed(good)
			r.Header.Set(ForwardHeader, edit(r.Header.Get(ForwardHeader)))
			return r
		}
	}

	tests := []struct {
		name    string
		req     func() *http.Request
		wantOK  bool
		wantErr string
	}{
		{name: "good", req: func() *http.Request { return signed(good) }, wantOK: true},
		{name: "signed 59s ago", req: func() *http.Request { return signed(signer(t, "node-a", "shared", now.Add(-59*time.Second))) }, wantOK: true},
		{name: "missing", req: func() *http.Request { return received(outgoing()) }},
		{name: "tampered path", req: func() *http.Request {
			r := signed(good)
			r.RequestURI = "/other?q=1&r=%20"
			r.URL.Path, r.URL.RawPath = "/other", ""
			return r
		}, wantErr: "wrong signature"},
		{name: "tampered query", req: func() *http.Request {
			r := signed(good)
			r.RequestURI = "/path/x?q=2&r=%20"
			r.URL.RawQuery = "q=2&r=%20"
			return r
		}, wantErr: "wrong signature"},
		{name: "tampered host", req: func() *http.Request {
			r := signed(good)
			r.Host = "s-other.preview.test"
			return r
		}, wantErr: "wrong signature"},
		{name: "tampered method", req: func() *http.Request {
			r := signed(good)
			r.Method = http.MethodDelete
			return r
		}, wantErr: "wrong signature"},
		{name: "tampered node", req: resigned(func(v string) string { return "node-x" + strings.TrimPrefix(v, "node-a") }), wantErr: "wrong signature"},
		{name: "stale", req: func() *http.Request { return signed(signer(t, "node-a", "shared", now.Add(-2*time.Minute))) }, wantErr: "more than 1m0s"},
		{name: "future", req: func() *http.Request { return signed(signer(t, "node-a", "shared", now.Add(2*time.Minute))) }, wantErr: "more than 1m0s"},
		{name: "wrong secret", req: func() *http.Request { return signed(signer(t, "node-a", "other", now)) }, wantErr: "wrong signature"},
		{name: "malformed", req: withHeader("node-a"), wantErr: "is not <node>"},
		{name: "bad hex", req: withHeader("node-a;1800000000;" + strings.Repeat("zz", 32)), wantErr: "not hex"},
		{name: "short signature", req: withHeader("node-a;1800000000;abcd"), wantErr: "not 64 hex digits"},
		// Longer than the digest: refused, not decoded past its buffer.
		{name: "long signature", req: resigned(func(v string) string { return v + "00" }), wantErr: "not 64 hex digits"},
		{name: "four fields", req: resigned(func(v string) string { return v + ";x" }), wantErr: "is not <node>"},
		{name: "two headers", req: func() *http.Request {
			r := signed(good)
			r.Header.Add(ForwardHeader, r.Header.Get(ForwardHeader))
			return r
		}, wantErr: "2 Sandwake-Forwarded headers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node, ok, err := verifier.Verify(tt.req())
			if tt.wantErr != "" {
				if !errors.Is(err, ErrUnsigned) || !strings.Contains(err.Error(), tt.wantErr) || ok {
					t.Fatalf("Verify = %q, %v, %v; want ErrUnsigned saying %q", node, ok, err, tt.wantErr)
				}
				return
			}
			if err != nil || ok != tt.wantOK || (ok && node != "node-a") {
				t.Fatalf("Verify = %q, %v, %v; want ok=%v from node-a", node, ok, err, tt.wantOK)
			}
		})
	}
}

// TestSignedRequestSurvivesForwarding sends raw request lines to a gateway
// that signs what it received and forwards it with a reverse proxy to an
// owner that verifies: request lines the proxy writes differently (a raw
// "|" or UTF-8 in the path, absolute form) must still verify.
func TestSignedRequestSurvivesForwarding(t *testing.T) {
	gatewayNode := signer(t, "node-a", "shared", time.Now())
	ownerNode := signer(t, "node-b", "shared", time.Now())
	gatewayNode.now, ownerNode.now = time.Now, time.Now

	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node, ok, err := ownerNode.Verify(r)
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusForbidden)
		case !ok:
			http.Error(w, "not signed", http.StatusBadRequest)
		default:
			fmt.Fprintf(w, "from %s: %s", node, r.RequestURI)
		}
	}))
	defer owner.Close()
	target, err := url.Parse(owner.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The owner's address only: path, query and Host stay the client's.
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
	}}
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gatewayNode.Sign(r)
		proxy.ServeHTTP(w, r)
	}))
	defer gateway.Close()

	for _, line := range []string{
		"/plain/path?q=1&r=%20",
		"/a|b^c",
		"/caf\xc3\xa9?x=\xc3\xa9",
		"/x%2Fy/%7e",
		"http://s-abc.preview.test/absolute?form=1",
	} {
		t.Run(line, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(gateway.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: s-abc.preview.test\r\nConnection: close\r\n\r\n", line); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "from node-a: ") {
				t.Fatalf("request line %q through the gateway: %d %s", line, resp.StatusCode, body)
			}
		})
	}
}

// BenchmarkSignVerify signs a forwarded request as the forwarding node does
// and verifies it as the owner's peer listener does: the cluster's own CPU
// and allocations on every forwarded request.
func BenchmarkSignVerify(b *testing.B) {
	now := time.Now()
	c, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}, Node: "node-a", Advertise: "node-a.test:8080", Peers: testPeers(b, "node-a"),
		Secret: []byte("a shared secret of a reasonable length")}, newMemSource())
	if err != nil {
		b.Fatal(err)
	}
	c.now = func() time.Time { return now }
	r := httptest.NewRequest(http.MethodGet, "/healthz?x=1", nil)
	r.Host = "s-abc123-3000.preview.example.com"
	b.ReportAllocs()
	for b.Loop() {
		r.Header.Del(ForwardHeader)
		c.Sign(r)
		if _, ok, err := c.Verify(r); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}
