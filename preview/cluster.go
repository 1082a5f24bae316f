package preview

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/cluster/peer"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle"
)

// serveCluster routes a preview request in cluster mode and reports whether
// it answered it. A request another node forwarded (it came through the
// peer listener, which verified the node) is served here and never
// forwarded again (no loops); one claiming to be forwarded anywhere else
// is refused. A request for a sandbox the catalog puts on another node
// goes to that node's peer listener (the same Host, so the owner routes
// it; websockets and streams pass through), and the owner does the wake,
// the warming page and the hold.
func (g *Handler) serveCluster(w http.ResponseWriter, r *http.Request, e *gateway.Gateway, s *gateway.Settings, id string, port int) (bool, error) {
	c := e.Cluster.Cluster
	if from := peer.Of(r); from != "" {
		peer.TrustForwarder(r)
		if en, ok := c.Lookup(id); ok && en.Node != c.Self() {
			if _, err := e.Routes.Get(id); err != nil {
				// The sender's catalog and this node's disagree: answer
				// rather than forward again.
				countRequest(outcomeNotFound)
				web.WriteError(w, http.StatusServiceUnavailable, "not_here",
					fmt.Sprintf("node %s forwarded sandbox %s here, but it lives on node %s; retry", from, id, en.Node), 1)
				return true, nil
			}
		}
		return false, nil
	}
	if _, claimed := r.Header[cluster.ForwardHeader]; claimed {
		countRequest(outcomeUnsignedForward)
		web.WriteError(w, http.StatusForbidden, "unsigned_forward", peer.ErrOutsidePeerListener, 0)
		return true, nil
	}
	en, ok := c.Lookup(id)
	if !ok || en.Node == c.Self() {
		return false, nil
	}
	if e.Routes.Holds(id) {
		// This node holds the sandbox: served here, whatever the
		// catalog says (see the publisher's repair).
		return false, nil
	}
	return true, g.forwardPreview(w, r, e, s, en, port)
}

// forwardPreview sends r to the owner node of entry en, over mutual TLS to
// its peer listener, signed. Nothing is sent unless the node is live with
// a registration its certificate covers and the listener at its address
// proves to be that node: else the visitor gets 503 host_unavailable.
func (g *Handler) forwardPreview(w http.ResponseWriter, r *http.Request, e *gateway.Gateway, s *gateway.Settings, en cluster.Entry, port int) error {
	cs := e.Cluster
	node, ok := cs.Node(en.Node)
	if !ok || !node.Live || node.Advertise == "" {
		return g.hostUnavailable(w, r, s, en, port)
	}
	fw := &forwardWriter{ResponseWriter: w}
	// An upgrade (a websocket) never leads: the proxy hijacks its
	// connection without writing, so its first answer would come when the
	// socket closes.
	if en.State != lifecycle.Running && !isUpgrade(r) {
		// One request per sandbox crosses to the owner while it wakes;
		// the others wait here for its first answer, then cross to a
		// running sandbox (a storm spread over the gateways opens a few
		// connections to the owner, not one per request).
		if lead := g.waitRemoteWake(r, s, en.ID); lead != nil {
			fw.answered = lead
			defer g.remoteWakes.Delete(en.ID)
		}
	}
	peer.CountForwardedPreview()
	g.peerProxy(cs, node.Name, node.Advertise).ServeHTTP(fw, r)
	fw.answer()
	if failed := fw.failed; failed != nil {
		// No answer from the node (nothing was written): it went down
		// before its lease ran out, or the listener at its address is not
		// that node.
		if errors.Is(failed, cluster.ErrPeerIdentity) {
			g.logger.Warn("refused to forward: the peer at the node's address is not that node",
				zap.String("id", en.ID), zap.String("node", en.Node), zap.String("addr", node.Advertise), zap.Error(failed))
		}
		return g.hostUnavailable(w, r, s, en, port)
	}
	return nil
}

// forwardWriter is the ResponseWriter a forward is proxied through: the
// proxy's error handler records its failure here (nothing written) for
// forwardPreview to answer. Unwrap keeps flushing and hijacking (streams,
// websockets) to the writer beneath. answered, when set, is closed at the
// owner's first answer (the request leading a remote wake).
type forwardWriter struct {
	http.ResponseWriter
	failed   error
	answered chan struct{}
}

func (fw *forwardWriter) Unwrap() http.ResponseWriter { return fw.ResponseWriter }

func (fw *forwardWriter) WriteHeader(code int) {
	fw.answer()
	fw.ResponseWriter.WriteHeader(code)
}

func (fw *forwardWriter) Write(b []byte) (int, error) {
	fw.answer()
	return fw.ResponseWriter.Write(b)
}

// answer closes answered, once.
func (fw *forwardWriter) answer() {
	if fw.answered != nil {
		close(fw.answered)
		fw.answered = nil
	}
}

// waitRemoteWake returns, for the first request for sandbox id while its
// catalog entry says it is not running, the channel to close at the
// owner's first answer (the caller leads and forwards at once); any other
// request waits for that answer (or its hold timeout, or its client gone)
// and gets nil.
func (g *Handler) waitRemoteWake(r *http.Request, s *gateway.Settings, id string) chan struct{} {
	lead := make(chan struct{})
	v, loaded := g.remoteWakes.LoadOrStore(id, lead)
	if !loaded {
		return lead
	}
	t := time.NewTimer(s.HoldTimeout)
	defer t.Stop()
	select {
	case <-v.(chan struct{}):
	case <-t.C:
	case <-r.Context().Done():
	}
	return nil
}

// peerProxy is the reverse proxy to node at addr, made once and kept: one
// per node, replaced when the node's address (a pod started again) or the
// engine's peer credentials change.
func (g *Handler) peerProxy(cs *peer.Node, node, addr string) *httputil.ReverseProxy {
	if v, ok := g.peerProxies.Load(node); ok {
		if pp := v.(*peerProxy); pp.cs == cs && pp.addr == addr {
			return pp.rp
		}
	}
	pp := &peerProxy{cs: cs, addr: addr, rp: &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "https", addr
			peer.SetForwardedHeaders(pr)
			// A visitor's request names no API caller: one it sent is
			// not signed on its behalf.
			delete(pr.Out.Header, cluster.CallerHeader)
			peer.SignForward(cs.Cluster, pr.Out)
		},
		Transport: cs.Transport(node, addr),
		// 0: answers of a known length are copied whole, streams (unknown
		// length, text/event-stream) flushed as they come, as the
		// standard library decides per answer. -1 would wrap every answer
		// in a flushing writer with a timer.
		FlushInterval: 0,
		BufferPool:    copyBuffers,
		ErrorLog:      peer.ForwardErrorLog,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if fw, ok := w.(*forwardWriter); ok {
				fw.failed = err
			}
		},
	}}
	g.peerProxies.Store(node, pp)
	return pp.rp
}

// peerProxy is a node's proxy with what it was made for.
type peerProxy struct {
	cs   *peer.Node
	addr string
	rp   *httputil.ReverseProxy
}

// copyBuffers are the forwarding proxies' copy buffers (32 KiB, as the
// standard library's own), reused instead of made per answer.
var copyBuffers = &bufferPool{pool: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}

type bufferPool struct{ pool sync.Pool }

func (p *bufferPool) Get() []byte  { return *(p.pool.Get().(*[]byte)) }
func (p *bufferPool) Put(b []byte) { p.pool.Put(&b) }

// hostUnavailable answers a request for a sandbox whose node is lost: 503
// with Retry-After, a page for browsers.
func (g *Handler) hostUnavailable(w http.ResponseWriter, r *http.Request, s *gateway.Settings, en cluster.Entry, port int) error {
	countRequest(outcomeHostUnavailable)
	if s.XRobotsTag != nil {
		w.Header()["X-Robots-Tag"] = s.XRobotsTag
	}
	msg := fmt.Sprintf("Sandbox %s lives on node %s, which cannot be reached now.", en.ID, en.Node)
	answer(w, r, http.StatusServiceUnavailable, pageData{Kind: pageUnavailable, Title: "Host unavailable",
		Message: msg + " This page retries by itself.", SandboxID: en.ID, Port: port, RetryAfter: peer.HostRetryAfter},
		"host_unavailable", msg+" Retry later.", peer.HostRetryAfter)
	return nil
}
