package preview

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster/clustertest"
	"github.com/sandwake/sandwake/cluster/peer"
	"github.com/sandwake/sandwake/gateway"
)

// readRequest parses raw as a server does.
func readRequest(t *testing.T, raw string) *http.Request {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		t.Fatalf("reading %q: %v", raw, err)
	}
	return r
}

// TestForwardSignatureMatchesTheWire: a preview request signed by the
// forwarding node verifies on the owner as the transport writes it, also
// when the request line it came with is not the one written on (a path
// with characters Go escapes, the absolute form).
func TestForwardSignatureMatchesTheWire(t *testing.T) {
	from, owner := clustertest.Node(t, "n1"), clustertest.Node(t, "n2")
	for _, target := range []string{
		"/healthz?x=1",
		"/files/a|b",
		"/x^y?q=%7C",
		"http://s-abc-8080.preview.localhost/absolute",
	} {
		r := readRequest(t, "GET "+target+" HTTP/1.1\r\nHost: s-abc-8080.preview.localhost\r\n\r\n")
		peer.SignForward(from, r)
		if r.RequestURI != target {
			t.Fatalf("signForward changed the request URI: %q, want %q", r.RequestURI, target)
		}
		// What reverse_proxy's transport sends: the request written as a
		// client request.
		out := r.Clone(context.Background())
		out.RequestURI = ""
		var wire bytes.Buffer
		if err := out.Write(&wire); err != nil {
			t.Fatal(err)
		}
		got := readRequest(t, wire.String())
		node, ok, err := owner.Verify(got)
		if err != nil || !ok || node != "n1" {
			t.Fatalf("request line %q, sent as %q: verify = %q %v %v, want signed by n1", target, got.RequestURI, node, ok, err)
		}
	}
}

// TestForwardedRequestTrustsItsNode: on the owner, a request another node
// forwarded (the peer listener verified it) has that node as a trusted
// proxy (reverse_proxy keeps the X-Forwarded-* headers it set) and the
// visitor it saw as the client (the event-stream caps count visitors, not
// the forwarding node); any other request gets neither, and one claiming
// to be forwarded outside the peer listener, even validly signed, is
// refused.
func TestForwardedRequestTrustsItsNode(t *testing.T) {
	from, owner := clustertest.Node(t, "n1"), clustertest.Node(t, "n2")
	e := &gateway.Gateway{Cluster: peer.NewNode(owner, nil, zap.NewNop(), nil)}
	g := &Handler{}
	request := func() *http.Request {
		r := readRequest(t, "GET /events HTTP/1.1\r\nHost: s-abc-8080.preview.localhost\r\n"+
			"X-Forwarded-For: 203.0.113.7, 10.0.0.9\r\nX-Forwarded-Proto: https\r\n\r\n")
		r.RemoteAddr = "10.0.0.2:40000"
		return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{
			caddyhttp.TrustedProxyVarKey: false, caddyhttp.ClientIPVarKey: "10.0.0.2",
		}))
	}
	serve := func(r *http.Request) (*http.Request, *httptest.ResponseRecorder, bool) {
		w := httptest.NewRecorder()
		done, err := g.serveCluster(w, r, e, &gateway.Settings{}, "abc", 8080)
		if err != nil {
			t.Fatal(err)
		}
		return r, w, done
	}

	r := request()
	r, w, done := serve(peer.Verified(r, "n1"))
	if done {
		t.Fatalf("a forwarded request: serveCluster answered %d %q, want it served here", w.Code, w.Body)
	}
	if trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool); !trusted {
		t.Fatal("the forwarding node is not a trusted proxy: reverse_proxy replaces its X-Forwarded-* with its own address and scheme")
	}
	if got, want := gateway.StreamClient(r), netip.MustParsePrefix("203.0.113.7/32"); got != want {
		t.Fatalf("stream client of a forwarded request = %s, want the visitor %s", got, want)
	}

	r, w, done = serve(request())
	if done {
		t.Fatalf("a visitor's request: serveCluster answered %d %q, want it served here", w.Code, w.Body)
	}
	if trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool); trusted {
		t.Fatal("a visitor's request is trusted as a proxy")
	}
	if got, want := gateway.StreamClient(r), netip.MustParsePrefix("10.0.0.2/32"); got != want {
		t.Fatalf("stream client of a visitor's request = %s, want its peer %s", got, want)
	}

	r = request()
	peer.SignForward(from, r)
	if _, w, done = serve(r); !done || w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "unsigned_forward") {
		t.Fatalf("a signed request on a visitor's listener: %v %d %s, want 403 unsigned_forward", done, w.Code, w.Body)
	}
}

// TestRemoteWakeLeadsOnce: while another node's sandbox is not running,
// the first forward for it leads (crosses at once) and the others wait
// here for its first answer, then cross; a client gone, or the hold
// timeout, ends a wait too.
func TestRemoteWakeLeadsOnce(t *testing.T) {
	g := New(func() *gateway.Gateway { return nil }, zap.NewNop())
	s := &gateway.Settings{HoldTimeout: time.Minute}
	req := httptest.NewRequest("GET", "http://s-x-8080.preview.localhost/", nil)
	lead := g.waitRemoteWake(req, s, "x")
	if lead == nil {
		t.Fatal("the first forward does not lead")
	}
	const n = 20
	var waited atomic.Int32
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if g.waitRemoteWake(req, s, "x") != nil {
				t.Error("a second forward leads too")
			}
			waited.Add(1)
		})
	}
	// Another sandbox's forward does not wait on this one.
	if g.waitRemoteWake(req, s, "y") == nil {
		t.Fatal("the first forward of another sandbox does not lead")
	}
	if got := waited.Load(); got != 0 {
		t.Fatalf("%d followers went before the leader's answer", got)
	}
	fw := &forwardWriter{ResponseWriter: httptest.NewRecorder(), answered: lead}
	fw.WriteHeader(http.StatusOK) // the owner's first answer
	wg.Wait()
	if got := waited.Load(); got != n {
		t.Fatalf("%d of %d followers released", got, n)
	}
	// A follower whose client is gone stops waiting, and so does one
	// whose hold timeout runs out: each well before the minute the leader
	// of "y" (never answered) would hold them.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for what, wait := range map[string]func(){
		"client gone":  func() { g.waitRemoteWake(httptest.NewRequest("GET", "/", nil).WithContext(ctx), s, "y") },
		"hold timeout": func() { g.waitRemoteWake(req, &gateway.Settings{HoldTimeout: time.Millisecond}, "y") },
	} {
		done := make(chan struct{})
		go func() { wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the follower still waits for the leader", what)
		}
	}
}
