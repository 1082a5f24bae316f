package docker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
)

// Bridge driver options sandwake sets on the sandbox network.
const (
	// networkICC turns inter-container communication on the network off.
	networkICC = "com.docker.network.bridge.enable_icc"
	// networkBridgeName names the bridge interface, so the firewall can
	// find it (and tell a local engine from a remote one).
	networkBridgeName = "com.docker.network.bridge.name"
)

// BridgeName is the bridge interface of sandbox network name: "sw-" and
// 12 hex digits of its hash (interface names have at most 15 bytes).
func BridgeName(name string) string {
	h := sha256.Sum256([]byte(name))
	return "sw-" + hex.EncodeToString(h[:6])
}

// SandboxNetwork implements lifecycle.NetworkRuntime: it makes sure the
// sandbox network exists, is this instance's, keeps sandboxes apart and
// has a subnet of its own, and describes it.
func (r *Runtime) SandboxNetwork(ctx context.Context) (lifecycle.SandboxNet, error) {
	if !r.ownsNetwork() {
		return lifecycle.SandboxNet{}, fmt.Errorf("%w: in upstream_mode network sandboxes join %s, a network sandwake does not own, so it cannot fix their addresses; "+
			"use upstream_mode published, or set egress unenforced", lifecycle.ErrEgressUnenforced, r.opts.Network)
	}
	return r.ensureNetwork(ctx)
}

// ensureNetwork makes sure the sandbox network exists, as SandboxNetwork
// says. It is checked on every create (creates are rare) so that a network
// removed by hand is made again.
func (r *Runtime) ensureNetwork(ctx context.Context) (n lifecycle.SandboxNet, err error) {
	if !r.ownsNetwork() {
		return lifecycle.SandboxNet{}, nil
	}
	r.netMu.Lock()
	defer r.netMu.Unlock()
	defer func() {
		if err == nil {
			r.resolveUpstream(n.Bridge)
		}
	}()
	name := r.opts.SandboxNetwork
	n, err = r.checkNetwork(ctx, name)
	if err == nil || !errors.Is(err, lifecycle.ErrNotFound) {
		return n, err
	}
	for attempt := 0; ; attempt++ {
		subnet := r.opts.SandboxSubnet
		if !subnet.IsValid() {
			if subnet, err = r.probeSubnet(ctx); err != nil {
				return lifecycle.SandboxNet{}, err
			}
		}
		_, err = r.cli.NetworkCreate(ctx, name, client.NetworkCreateOptions{
			Driver:  "bridge",
			Options: map[string]string{networkICC: "false", networkBridgeName: BridgeName(name)},
			Labels:  r.labels(""),
			IPAM: &network.IPAM{Driver: "default", Config: []network.IPAMConfig{{
				Subnet: subnet, Gateway: subnet.Addr().Next(), IPRange: engineRange(subnet),
			}}},
		})
		switch {
		case err == nil:
			return r.checkNetwork(ctx, name)
		case cerrdefs.IsConflict(err):
			// Made by another gateway meanwhile: check it as any existing one.
			return r.checkNetwork(ctx, name)
		case !r.opts.SandboxSubnet.IsValid() && attempt < 3:
			// The probed subnet was taken between the probe and the
			// create: probe again.
			continue
		}
		return lifecycle.SandboxNet{}, classify("creating network "+name, err, lifecycle.ErrUnavailable)
	}
}

// probeSubnet asks the engine for a free subnet from its address pools
// (which avoid its other networks and the host's routes) by making a
// throwaway network and reading what it was given.
func (r *Runtime) probeSubnet(ctx context.Context) (netip.Prefix, error) {
	var b [4]byte
	rand.Read(b[:])
	probe := "sandwake-probe-" + hex.EncodeToString(b[:])
	res, err := r.cli.NetworkCreate(ctx, probe, client.NetworkCreateOptions{Driver: "bridge", Labels: r.labels("")})
	if err != nil {
		return netip.Prefix{}, classify("choosing a subnet for the sandbox network", err, lifecycle.ErrUnavailable)
	}
	defer r.cli.NetworkRemove(context.WithoutCancel(ctx), res.ID, client.NetworkRemoveOptions{})
	ins, err := r.cli.NetworkInspect(ctx, res.ID, client.NetworkInspectOptions{})
	if err != nil {
		return netip.Prefix{}, classify("choosing a subnet for the sandbox network", err, lifecycle.ErrUnavailable)
	}
	for _, c := range ins.Network.IPAM.Config {
		if c.Subnet.Addr().Is4() && c.Subnet.Bits() <= 24 {
			return c.Subnet.Masked(), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("choosing a subnet for the sandbox network: the engine gave no IPv4 subnet of /24 or larger (%v); set sandbox_subnet", ins.Network.IPAM.Config)
}

// engineRange is the part of subnet the engine allocates from (the top
// sixteenth): sandwake hands out the addresses below it.
func engineRange(subnet netip.Prefix) netip.Prefix {
	bits := min(subnet.Bits()+4, 28)
	last := u32(subnet.Masked().Addr()) | (^uint32(0) >> subnet.Bits())
	return netip.PrefixFrom(addr4(last), bits).Masked()
}

// checkNetwork accepts network name if it keeps sandboxes apart, is this
// instance's and has a subnet of its own; a missing one wraps ErrNotFound.
func (r *Runtime) checkNetwork(ctx context.Context, name string) (lifecycle.SandboxNet, error) {
	res, err := r.cli.NetworkInspect(ctx, name, client.NetworkInspectOptions{})
	if err != nil {
		return lifecycle.SandboxNet{}, classify("inspecting network "+name, err, lifecycle.ErrNotFound)
	}
	nw := res.Network
	if nw.Driver != "bridge" || nw.Options[networkICC] != "false" {
		return lifecycle.SandboxNet{}, fmt.Errorf("network %s would let sandboxes reach each other (driver %q, %s=%q; want a bridge with it false): remove it and sandwake makes it again, or set sandbox_network to another name",
			name, nw.Driver, networkICC, nw.Options[networkICC])
	}
	if owner := nw.Labels[LabelInstance]; nw.Labels[LabelManaged] != "true" || owner != r.opts.Instance {
		return lifecycle.SandboxNet{}, fmt.Errorf("network %s is not this gateway's (its instance label is %q, this gateway is %q): each instance has a sandbox network of its own, "+
			"because sandwake fixes sandbox addresses in it; remove the sandbox_network option (the default is sandwake-<instance>) or name another network", name, owner, r.opts.Instance)
	}
	var cfg *network.IPAMConfig
	for i := range nw.IPAM.Config {
		if nw.IPAM.Config[i].Subnet.Addr().Is4() {
			cfg = &nw.IPAM.Config[i]
		}
	}
	if cfg == nil || !cfg.IPRange.IsValid() {
		return lifecycle.SandboxNet{}, fmt.Errorf("network %s has no subnet and address range of its own (made by an older sandwake?): sandwake needs them to fix sandbox addresses; "+
			"remove it (docker network rm %s) and sandwake makes it again, or set sandbox_network to a new name", name, name)
	}
	bridge := nw.Options[networkBridgeName]
	if bridge == "" {
		bridge = "br-" + nw.ID[:12]
	}
	subnet := cfg.Subnet.Masked()
	gw := cfg.Gateway
	if !gw.IsValid() {
		gw = subnet.Addr().Next()
	}
	n := lifecycle.SandboxNet{
		Name: name, Bridge: bridge, Subnet: subnet, Gateway: gw,
		First: subnet.Addr().Next().Next(),
		Last:  addr4(u32(cfg.IPRange.Masked().Addr()) - 1),
	}
	if gw.Compare(n.First) >= 0 && gw.Compare(n.Last) <= 0 {
		// A gateway inside the range (a network made by hand): start after it.
		n.First = gw.Next()
	}
	return n, nil
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
