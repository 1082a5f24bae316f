package caddymodule

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sandwake/sandwake/cluster"
)

// hostRetryAfter is the Retry-After, in seconds, of a sandbox whose node is
// unreachable.
const hostRetryAfter = 5

// serveCluster routes a preview request in cluster mode and reports whether
// it answered it. A request signed by another node is served here and never
// forwarded again (no loops); one claiming to be forwarded without a valid
// signature is refused. A request for a sandbox the catalog puts on another
// node goes to that node's preview listener through reverse_proxy (the same
// Host, so the owner routes it; websockets and streams pass through), and
// the owner does the wake, the warming page and the hold.
func (g *Gate) serveCluster(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *engine, s *settings, id string, port int) (bool, error) {
	c := e.cluster.c
	if _, claimed := r.Header[cluster.ForwardHeader]; claimed {
		from, _, err := c.Verify(r)
		if err != nil {
			countRequest(outcomeUnsignedForward)
			writeJSONError(w, http.StatusForbidden, "unsigned_forward", err.Error(), 0)
			return true, nil
		}
		r.Header.Del(cluster.ForwardHeader) // the app never sees it
		trustForwarder(r)
		if en, ok := c.Lookup(id); ok && en.Node != c.Self() {
			if _, err := e.routes.get(id); err != nil {
				// The sender's catalog and this node's disagree: answer
				// rather than forward again.
				countRequest(outcomeNotFound)
				writeJSONError(w, http.StatusServiceUnavailable, "not_here",
					fmt.Sprintf("node %s forwarded sandbox %s here, but it lives on node %s; retry", from, id, en.Node), 1)
				return true, nil
			}
		}
		return false, nil
	}
	en, ok := c.Lookup(id)
	if !ok || en.Node == c.Self() {
		return false, nil
	}
	return true, g.forwardPreview(w, r, next, e, s, en, port)
}

// forwardPreview sends r to the owner node of entry en, signed.
func (g *Gate) forwardPreview(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, e *engine, s *settings, en cluster.Entry, port int) error {
	node, ok := e.cluster.c.Node(en.Node)
	if !ok || !node.Live || node.Advertise == "" {
		return g.hostUnavailable(w, r, s, en, port)
	}
	signForward(e.cluster.c, r)
	metricForwardedPreview.Inc()
	caddyhttp.SetVar(r.Context(), varUpstream, e.cluster.upstream(node.Advertise))
	err := next.ServeHTTP(w, r)
	if isUpstreamFailure(err) {
		// No answer from the node (reverse_proxy wrote nothing): it went
		// down before its lease ran out.
		return g.hostUnavailable(w, r, s, en, port)
	}
	return err
}

// signForward signs r for the owner node. The signature covers the request
// URI as the transport writes it (r.URL.RequestURI()), which is what the
// owner receives: the request line as this node received it may differ
// (the absolute form, or characters such as | and ^ that Go escapes when it
// writes a path), and a signature over it would be refused there.
func signForward(c *cluster.Cluster, r *http.Request) {
	uri := r.RequestURI
	r.RequestURI = r.URL.RequestURI()
	c.Sign(r)
	r.RequestURI = uri
}

// trustForwarder treats the node that signed r as a trusted proxy: the
// X-Forwarded-For, -Proto and -Host it set are kept by reverse_proxy (the
// app sees the visitor's address and scheme, not the forwarding node's),
// and the client, for the event-stream caps, is the visitor that node saw
// (the first X-Forwarded-For address, as Caddy takes it from a trusted
// proxy), not the node, which would make every visitor it forwards one
// client.
func trustForwarder(r *http.Request) {
	caddyhttp.SetVar(r.Context(), caddyhttp.TrustedProxyVarKey, true)
	first, _, _ := strings.Cut(r.Header.Get("X-Forwarded-For"), ",")
	if addr, err := netip.ParseAddr(strings.TrimSpace(first)); err == nil {
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, addr.String())
	}
}

// hostUnavailable answers a request for a sandbox whose node is lost: 503
// with Retry-After, a page for browsers.
func (g *Gate) hostUnavailable(w http.ResponseWriter, r *http.Request, s *settings, en cluster.Entry, port int) error {
	countRequest(outcomeHostUnavailable)
	if s.xRobotsTag != nil {
		w.Header()["X-Robots-Tag"] = s.xRobotsTag
	}
	msg := fmt.Sprintf("Sandbox %s lives on node %s, which cannot be reached now.", en.ID, en.Node)
	answer(w, r, http.StatusServiceUnavailable, pageData{Kind: pageUnavailable, Title: "Host unavailable",
		Message: msg + " This page retries by itself.", SandboxID: en.ID, Port: port, RetryAfter: hostRetryAfter},
		"host_unavailable", msg+" Retry later.", hostRetryAfter)
	return nil
}

// upstream is the upstream value for a node's advertised address, shared by
// every request forwarded there.
func (cs *clusterState) upstream(addr string) *upstreamSet {
	if v, ok := cs.upstreams.Load(addr); ok {
		return v.(*upstreamSet)
	}
	v, _ := cs.upstreams.LoadOrStore(addr, &upstreamSet{dial: addr})
	return v.(*upstreamSet)
}
