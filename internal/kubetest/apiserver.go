package kubetest

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"sync"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// APIServerName is the name pods give the API server in the cluster (the
// kubernetes Service's), which the API server's certificate carries.
const APIServerName = "kubernetes.default.svc"

// ForwardAPIServer makes the cluster's API server reachable from its pods
// until the test ends, which the test cluster cannot do by itself: its API
// server listens on loopback only, and it has no kube-proxy to carry the
// kubernetes Service. It forwards TCP from a port of the bridge's host
// address to the API server's loopback address, and returns that port's
// address: a pod reaches it as APIServerName with a hostAliases entry for
// the address and KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT set
// to the name and the port (client-go's in-cluster config reads them).
func (c Cluster) ForwardAPIServer(t testing.TB) *APIForward {
	t.Helper()
	f, err := c.startForward()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.f.close)
	return f
}

// APIForward is a forward of the API server (ForwardAPIServer).
type APIForward struct {
	// Addr is the forward's address on the bridge.
	Addr netip.AddrPort
	f    *forwarder
}

// Cut, while cut is true, closes the forward's connections and every new
// one at once: to the pods the API server is gone, as in an outage of the
// control plane, while the kubelet (which reaches it directly) goes on.
func (a *APIForward) Cut(cut bool) {
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	a.f.cut = cut
	if cut {
		for c := range a.f.open {
			c.Close()
		}
	}
}

// StartAPIForward is ForwardAPIServer for a caller that is not a test
// (the bench): it returns the forward's address and the function that
// stops it.
func (c Cluster) StartAPIForward() (netip.AddrPort, func(), error) {
	f, err := c.startForward()
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	return f.Addr, f.f.close, nil
}

func (c Cluster) startForward() (*APIForward, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig's server %q: %w", cfg.Host, err)
	}
	target, err := netip.ParseAddrPort(u.Host)
	if err != nil || !target.Addr().IsLoopback() {
		return nil, fmt.Errorf("the kubeconfig's server %q is not a loopback address and port: not forwarded to", cfg.Host)
	}
	host, err := c.bridgeAddr()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(host, 0).String())
	if err != nil {
		return nil, err
	}
	f := &forwarder{ln: ln, target: target.String(), open: map[net.Conn]bool{}}
	f.wg.Go(f.accept)
	return &APIForward{Addr: netip.MustParseAddrPort(ln.Addr().String()), f: f}, nil
}

// bridgeAddr is the host's IPv4 address on the cluster's CNI bridge (the
// pods' gateway).
func (c Cluster) bridgeAddr() (netip.Addr, error) {
	ifc, err := net.InterfaceByName(c.Bridge)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("CNI bridge %s: %w", c.Bridge, err)
	}
	addrs, _ := ifc.Addrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("CNI bridge %s has no IPv4 address (%v)", c.Bridge, addrs)
}

// forwarder copies each connection accepted on ln to a connection to
// target and back; close stops it and waits for every copy.
type forwarder struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	open   map[net.Conn]bool
	closed bool
	cut    bool // connections are closed at once (APIForward.Cut)
}

func (f *forwarder) accept() {
	for {
		in, err := f.ln.Accept()
		if err != nil {
			return // closed
		}
		f.mu.Lock()
		cut := f.cut
		f.mu.Unlock()
		if cut {
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", f.target)
		if err != nil {
			in.Close()
			continue
		}
		switch f.track(in, out) {
		case tracked:
		case refused:
			continue
		case stopped:
			return
		}
		f.wg.Go(func() { f.copy(out, in) })
		f.wg.Go(func() { f.copy(in, out) })
	}
}

// What track did with a pair of connections.
const (
	tracked = iota // recorded as open
	refused        // closed: the forward is cut
	stopped        // closed: the forward is closed
)

// track records the pair as open, unless close has run or the forward is
// cut (it closes them).
func (f *forwarder) track(conns ...net.Conn) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || f.cut {
		for _, c := range conns {
			c.Close()
		}
		if f.closed {
			return stopped
		}
		return refused
	}
	for _, c := range conns {
		f.open[c] = true
	}
	return tracked
}

// copy copies src to dst, then closes both (the other direction ends too).
func (f *forwarder) copy(dst, src net.Conn) {
	io.Copy(dst, src)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range []net.Conn{dst, src} {
		c.Close()
		delete(f.open, c)
	}
}

func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for c := range f.open {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
