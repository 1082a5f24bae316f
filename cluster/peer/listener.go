package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/internal/web"
)

// APIHost is the Host of an API call forwarded to a node's peer
// listener; any other Host is a preview request's (the visitor's). It
// cannot be a preview host (those start with s-), and .invalid never
// resolves.
const APIHost = "api.sandwake.invalid"

// peerKey is the request context key of the node that forwarded a request
// to the peer listener; only the peer listener sets it.
type peerKey struct{}

// Of is the node that forwarded r, verified by the peer listener (its
// certificate and signature); "" for a request from anyone else.
func Of(r *http.Request) string {
	node, _ := r.Context().Value(peerKey{}).(string)
	return node
}

// Verified marks r as forwarded by node, as the peer listener does once the
// node's certificate and signature are verified (Of then returns node).
// Nothing else may call it but tests of the handlers behind the listener.
func Verified(r *http.Request, node string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), peerKey{}, node))
}

// peerTargets are what the peer listener hands forwarded requests to, from
// the current config: the HTTP server of the sandwake_preview site (the
// request takes the route a visitor's would) and the sandwake_api handler.
type peerTargets struct {
	preview http.Handler
	api     http.Handler
}

// peerListener is the node's peer listener: the only place that accepts
// requests forwarded by other nodes. It speaks TLS 1.3 and requires a
// client certificate of the cluster CA naming a node, and a request
// signed by that same node. It lives with the engine (a reload swaps its
// targets and credentials, not the listener).
type peerListener struct {
	cs      *Node
	log     *zap.Logger
	targets atomic.Pointer[peerTargets]

	mu   sync.Mutex
	srv  *http.Server
	done chan struct{} // closed when Serve returned
}

func newPeerListener(cs *Node, log *zap.Logger) *peerListener {
	return &peerListener{cs: cs, log: log}
}

// start listens on addr and serves until close.
func (p *peerListener) start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("sandwake: cluster: peer_listen %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          zap.NewStdLog(p.log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))),
		// HTTP/1.1 only: upgrades (websockets) pass through as they do
		// on the preview listener.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.srv, p.done = srv, done
	p.mu.Unlock()
	go func() {
		defer close(done)
		if err := srv.Serve(tls.NewListener(ln, p.cs.Peers.ServerConfig())); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("peer listener stopped", zap.String("addr", addr), zap.Error(err))
		}
	}()
	return nil
}

// close stops the listener and the requests it serves, and waits for it.
func (p *peerListener) close() error {
	p.mu.Lock()
	srv, done := p.srv, p.done
	p.srv = nil
	p.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Close()
	<-done
	if err != nil {
		return fmt.Errorf("closing the peer listener: %w", err)
	}
	return nil
}

// ServeHTTP serves one forwarded request: the node its certificate names
// must have signed it; it is then served here and never forwarded again,
// as a preview request through the preview site's server, or as an API
// call (Host APIHost) by the API handler, which takes the node's
// identity instead of a token.
func (p *peerListener) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	node, ok := cluster.PeerNode(*r.TLS)
	if !ok { // the handshake requires one: never here
		web.WriteError(w, http.StatusForbidden, "unsigned_forward", "no verified node certificate", 0)
		return
	}
	from, signed, err := p.cs.Verify(r)
	if err == nil && (!signed || from != node) {
		err = fmt.Errorf("%w: signed by %q, certificate of node %s", cluster.ErrUnsigned, from, node)
	}
	if err != nil {
		if p.cs.onUnsigned != nil {
			p.cs.onUnsigned()
		}
		web.WriteError(w, http.StatusForbidden, "unsigned_forward", err.Error(), 0)
		return
	}
	r.Header.Del(cluster.ForwardHeader) // the app never sees it
	r = Verified(r, node)
	// The hop's TLS is not the visitor's: the scheme the visitor used
	// comes in X-Forwarded-Proto from the verified node, and the
	// preview server's own TLS rules (strict SNI) are for its listener.
	r.TLS = nil
	t := p.targets.Load()
	if r.Host == APIHost {
		if t == nil || t.api == nil {
			web.WriteError(w, http.StatusServiceUnavailable, "unavailable", "this node serves no management API (no sandwake_api handler in its config)", 1)
			return
		}
		t.api.ServeHTTP(w, r)
		return
	}
	if t == nil || t.preview == nil {
		web.WriteError(w, http.StatusServiceUnavailable, "unavailable", "this node serves no preview site (no sandwake_preview route in its config)", 1)
		return
	}
	t.preview.ServeHTTP(w, r)
}

// peerDialsAtOnce bounds the connections being opened to one peer at once.
const peerDialsAtOnce = 8

// Transport is the transport to node at addr (its advertised peer
// listener): TLS 1.3 with this node's certificate, and the peer's
// accepted only if the cluster CA issued it to node for addr's host.
func (cs *Node) Transport(node, addr string) *http.Transport {
	key := node + "\x00" + addr
	if v, ok := cs.transports.Load(key); ok {
		return v.(*http.Transport)
	}
	host, _, _ := net.SplitHostPort(addr)
	tlsConfig := cs.Peers.ClientConfig(node, host)
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	// Connections are opened (a TCP dial and a TLS handshake with client
	// certificates, costly for both nodes) a few at a time: a burst of
	// requests waits for them or for a connection another request gives
	// back, which the transport hands to the first waiting, instead of
	// every request opening one of its own.
	dials := make(chan struct{}, peerDialsAtOnce)
	t := &http.Transport{
		Proxy: nil,
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			select {
			case dials <- struct{}{}:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			defer func() { <-dials }()
			raw, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			tc := tls.Client(raw, tlsConfig)
			if err := tc.HandshakeContext(hctx); err != nil {
				raw.Close()
				return nil, err
			}
			return tc, nil
		},
		// Kept for as many requests as run at once: a connection
		// closed for want of an idle slot costs a TLS handshake to open
		// again, which under load costs more than the requests.
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// A forwarded request keeps the client's Accept-Encoding, and the
		// answer the encoding the owner node sent: the transport neither
		// asks for gzip on the client's behalf nor inflates it here.
		DisableCompression: true,
	}
	v, loaded := cs.transports.LoadOrStore(key, t)
	if loaded {
		t.CloseIdleConnections()
	}
	return v.(*http.Transport)
}

// Interface guards.
var _ http.Handler = (*peerListener)(nil)
