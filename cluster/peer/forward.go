package peer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/internal/web"
)

// HostRetryAfter is the Retry-After, in seconds, of a sandbox whose node is
// unreachable.
const HostRetryAfter = 5

// ErrOutsidePeerListener answers a request claiming to come from another
// node anywhere but the peer listener.
const ErrOutsidePeerListener = "node-to-node requests are accepted only on the cluster's peer listener (peer_listen), over mutual TLS"

// ForwardErrorLog takes the forwarding proxies' own log lines, which say
// what the caller handles (a visitor gone, an owner lost).
var ForwardErrorLog = log.New(io.Discard, "", 0)

// SetForwardedHeaders sets the X-Forwarded-For, -Proto and -Host of a
// forwarded request as Caddy's reverse_proxy does: the visitor's address
// and scheme, or, from a trusted proxy in front of this gateway, what that
// proxy said with its address added.
func SetForwardedHeaders(pr *httputil.ProxyRequest) {
	in, out := pr.In, pr.Out.Header
	trusted, _ := caddyhttp.GetVar(in.Context(), caddyhttp.TrustedProxyVarKey).(bool)
	clientIP, _, err := net.SplitHostPort(in.RemoteAddr)
	if err != nil {
		return
	}
	clientIP, _, _ = strings.Cut(clientIP, "%")
	if prior := strings.Join(in.Header.Values("X-Forwarded-For"), ", "); trusted && prior != "" {
		out.Set("X-Forwarded-For", prior+", "+clientIP)
	} else {
		out.Set("X-Forwarded-For", clientIP)
	}
	proto := "http"
	if in.TLS != nil {
		proto = "https"
	}
	if prior := in.Header.Get("X-Forwarded-Proto"); trusted && prior != "" {
		proto = prior
	}
	out.Set("X-Forwarded-Proto", proto)
	host := in.Host
	if prior := in.Header.Get("X-Forwarded-Host"); trusted && prior != "" {
		host = prior
	}
	out.Set("X-Forwarded-Host", host)
}

// SignForward signs r for the owner node. The signature covers the request
// URI as the transport writes it (r.URL.RequestURI()), which is what the
// owner receives: the request line as this node received it may differ
// (the absolute form, or characters such as | and ^ that Go escapes when it
// writes a path), and a signature over it would be refused there.
func SignForward(c *cluster.Cluster, r *http.Request) {
	uri := r.RequestURI
	r.RequestURI = r.URL.RequestURI()
	c.Sign(r)
	r.RequestURI = uri
}

// TrustForwarder treats the node that forwarded r (verified by the peer
// listener) as a trusted proxy: the X-Forwarded-For, -Proto and -Host it
// set are kept by reverse_proxy (the app sees the visitor's address and
// scheme, not the forwarding node's), and the client, for the event-stream
// caps, is the visitor that node saw (the first X-Forwarded-For address,
// as Caddy takes it from a trusted proxy), not the node, which would make
// every visitor it forwards one client.
func TrustForwarder(r *http.Request) {
	caddyhttp.SetVar(r.Context(), caddyhttp.TrustedProxyVarKey, true)
	first, _, _ := strings.Cut(r.Header.Get("X-Forwarded-For"), ",")
	if addr, err := netip.ParseAddr(strings.TrimSpace(first)); err == nil {
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, addr.String())
	}
}

// Forwarded reports whether r came from another node: through the peer
// listener, which verified the node's certificate and signature.
func Forwarded(r *http.Request) bool {
	return Of(r) != ""
}

// CheckForward refuses, in cluster mode (n is not nil), a request that claims to come from
// another node anywhere but the peer listener, and reports whether it may
// go on.
func CheckForward(w http.ResponseWriter, r *http.Request, n *Node) bool {
	if _, claimed := r.Header[cluster.ForwardHeader]; n == nil || !claimed {
		return true
	}
	web.WriteError(w, http.StatusForbidden, "unsigned_forward", ErrOutsidePeerListener, 0)
	return false
}

// ForwardAPI hands r to node's management API through its peer listener
// (mutual TLS, signed): the call carries this node's identity, never the
// caller's Authorization: caller, the principal the call is decided as,
// goes with it, signed. body, when not nil, replaces r's (already read)
// body. The answer, streams included, is relayed as it comes.
func (cs *Node) ForwardAPI(w http.ResponseWriter, r *http.Request, nodeName, what, caller string, body []byte) {
	cs.ProxyAPI(w, r, nodeName, what, caller, body, false)
}

// ProxyAPI is ForwardAPI; with onlyIfDialed, a node that cannot be dialled
// (nothing was sent) gets no answer written: ProxyAPI reports it instead,
// so that the caller can try another node.
func (cs *Node) ProxyAPI(w http.ResponseWriter, r *http.Request, nodeName, what, caller string, body []byte, onlyIfDialed bool) (notDialed bool) {
	c := cs.Cluster
	node, ok := c.Node(nodeName)
	if !ok || !node.Live || node.Advertise == "" {
		if onlyIfDialed {
			return true
		}
		web.WriteError(w, http.StatusServiceUnavailable, "host_unavailable",
			fmt.Sprintf("%s, which cannot be reached now (its lease is gone); retry later", what), HostRetryAfter)
		return false
	}
	metricForwardedAPI.Inc()
	// connected turns true once a connection to the node (verified as
	// the node) carries the call: before that nothing was sent, so
	// sending it elsewhere cannot do it twice.
	var connected atomic.Bool
	// reused: the connection was a kept one, which a node that died (or
	// closed it idle) leaves behind: a write into it that ends at once in
	// EOF or a reset reached no process.
	var reused atomic.Bool
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "https", node.Advertise, APIHost
			// The node's certificate authenticates the call: the
			// operator's token never leaves this gateway. Who called
			// goes with it, signed, for the owner to decide as.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header[cluster.CallerHeader] = []string{caller}
			if body != nil {
				pr.Out.Body = io.NopCloser(bytes.NewReader(body))
				pr.Out.ContentLength = int64(len(body))
				pr.Out.Header.Set("Content-Type", "application/json")
			}
			c.Sign(pr.Out)
			pr.Out = pr.Out.WithContext(httptrace.WithClientTrace(pr.Out.Context(), &httptrace.ClientTrace{
				GotConn: func(info httptrace.GotConnInfo) {
					reused.Store(info.Reused)
					connected.Store(true)
				},
			}))
		},
		Transport:     cs.Transport(node.Name, node.Advertise),
		FlushInterval: -1, // event streams pass through as they come
		ErrorLog:      ForwardErrorLog,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			deadKept := reused.Load() && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET))
			if onlyIfDialed && (!connected.Load() || deadKept) {
				notDialed = true
				return
			}
			if errors.Is(err, cluster.ErrPeerIdentity) {
				cs.log.Warn("refused to forward an API call: the peer at the node's address is not that node",
					zap.String("node", node.Name), zap.String("addr", node.Advertise), zap.Error(err))
			}
			web.WriteError(w, http.StatusServiceUnavailable, "host_unavailable",
				fmt.Sprintf("%s, whose peer listener at %s did not answer: %v; retry later", what, node.Advertise, err), HostRetryAfter)
		},
	}
	rp.ServeHTTP(w, r)
	return notDialed
}
