package docker

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
)

// This file decides how the gateway reaches sandboxes (the upstream mode)
// when the operator leaves it to sandwake: the sandbox's own address where
// the gateway can route to it, else a port published on the host.

// UpstreamDirect dials each sandbox at its own address on the sandbox
// network (<address>:<port>): nothing is published on the host and no
// userland proxy runs for a sandbox. For a gateway on the engine's host.
const UpstreamDirect = "direct"

// UpstreamAuto lets the runtime choose: direct where the engine is local
// and the sandbox bridge is in the gateway's network namespace, else
// published.
const UpstreamAuto = "auto"

// chooseUpstream decides the mode for an engine at host (the DOCKER_HOST
// form: unix://…, tcp://host:port, ssh://…; "" for the local socket) and
// reports why. local are the addresses of this network namespace;
// bridgeHere whether the sandbox network's bridge is one of its
// interfaces.
func chooseUpstream(host string, local []netip.Addr, bridge string, bridgeHere bool) (mode, why string) {
	where, isLocal := engineLocal(host, local)
	switch {
	case !isLocal:
		return UpstreamPublished, fmt.Sprintf("the Docker engine is at %s, not on this host: its sandbox addresses are not routable from here, so ports are published", where)
	case !bridgeHere:
		return UpstreamPublished, fmt.Sprintf("the sandbox network's bridge %s is not in this gateway's network namespace (Docker Desktop's VM, or a gateway in a container without the host's network), so ports are published", bridge)
	}
	return UpstreamDirect, fmt.Sprintf("the Docker engine (%s) is on this host and the sandbox bridge %s is in this network namespace: the gateway dials each sandbox's own address, nothing is published", where, bridge)
}

// engineLocal reports whether an engine at host runs on this host, and
// names it.
func engineLocal(host string, local []netip.Addr) (string, bool) {
	if host == "" {
		return "the local socket", true
	}
	u, err := url.Parse(host)
	if err != nil {
		return host, false
	}
	switch u.Scheme {
	case "unix", "npipe":
		return host, true
	case "tcp", "http", "https":
		h := u.Hostname()
		if h == "localhost" {
			return host, true
		}
		a, err := netip.ParseAddr(h)
		if err != nil {
			// A name: local only if it resolves to an address of this
			// host (checked by the caller's list).
			addrs, lerr := net.LookupHost(h)
			if lerr != nil || len(addrs) == 0 {
				return host, false
			}
			if a, err = netip.ParseAddr(addrs[0]); err != nil {
				return host, false
			}
		}
		a = a.Unmap()
		if a.IsLoopback() {
			return host, true
		}
		for _, l := range local {
			if l == a {
				return host, true
			}
		}
		return host, false
	}
	// ssh:// and anything else: another machine, as far as routing goes.
	return host, false
}

// localAddrs are the addresses of this network namespace's interfaces.
func localAddrs() []netip.Addr {
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range ifs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// resolveUpstream settles an auto mode once the sandbox network exists
// (the caller holds netMu and knows the network's bridge).
func (r *Runtime) resolveUpstream(bridge string) {
	if r.mode.Load() != nil {
		return
	}
	host := r.opts.Host
	if host == "" {
		host = os.Getenv("DOCKER_HOST")
	}
	_, err := net.InterfaceByName(bridge)
	mode, why := chooseUpstream(host, localAddrs(), bridge, err == nil)
	r.mode.Store(&upstreamChoice{mode: mode, why: why})
}

// upstreamChoice is the mode in force and why.
type upstreamChoice struct{ mode, why string }

// UpstreamMode reports the upstream mode in force (direct, published or
// network) and why. An automatic choice is made when the sandbox network
// is first set up; before that the mode is "auto".
func (r *Runtime) UpstreamMode(ctx context.Context) (mode, why string) {
	if c := r.mode.Load(); c != nil {
		return c.mode, c.why
	}
	if _, err := r.ensureNetwork(ctx); err != nil {
		return UpstreamAuto, "not decided yet: the sandbox network could not be set up: " + err.Error()
	}
	if c := r.mode.Load(); c != nil {
		return c.mode, c.why
	}
	return UpstreamAuto, "not decided yet"
}

// direct reports whether sandboxes are dialled at their own addresses.
func (r *Runtime) direct() bool {
	c := r.mode.Load()
	return c != nil && c.mode == UpstreamDirect
}

// published reports whether ports are published on the host.
func (r *Runtime) published() bool {
	c := r.mode.Load()
	return c != nil && c.mode == UpstreamPublished
}

// ownsNetwork reports whether sandboxes join the instance's own sandbox
// network (every mode but network).
func (r *Runtime) ownsNetwork() bool { return r.opts.UpstreamMode != UpstreamNetwork }

// Direct implements lifecycle.DirectUpstreams.
func (r *Runtime) Direct() bool { return r.direct() }
