package docker

import (
	"context"
	"fmt"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
)

// UninstallOptions configure Uninstall.
type UninstallOptions struct {
	// Volumes removes the instance's volumes too (the sandboxes' disks).
	Volumes bool
	// Running reports whether a gateway serves sandbox network n: when it
	// does for one of the instance's networks, Uninstall removes nothing
	// and fails. Nil: not checked.
	Running func(n lifecycle.SandboxNet) bool
	// Check is asked about each of the instance's networks, before
	// Running and before anything is removed: an error refuses the
	// uninstall (Running cannot see that network from here). Nil: not
	// checked.
	Check func(n lifecycle.SandboxNet) error
}

// Uninstalled is what Uninstall removed, by name.
type Uninstalled struct {
	Containers, Volumes, Networks []string
	// Bridges are the bridges of the networks removed, and of the
	// instance's sandbox network when it was gone already: the egress
	// firewall's tables of each are to go with them.
	Bridges []string
}

// Uninstall removes from the engine what this runtime's instance made:
// every container labelled with it (sandboxes, their services, warm pool
// containers), with Volumes its volumes, and its networks (the sandbox
// network). Objects of other instances, and unlabelled ones, are left
// alone. It refuses, before removing anything, while opts.Running says a
// gateway of the instance serves one of its networks. What it removed
// before a failure is answered with the error.
func (r *Runtime) Uninstall(ctx context.Context, opts UninstallOptions) (Uninstalled, error) {
	var out Uninstalled
	inst := r.opts.Instance
	f := client.Filters{}.Add("label", LabelManaged+"=true").Add("label", LabelInstance+"="+inst)
	nets, err := r.cli.NetworkList(ctx, client.NetworkListOptions{Filters: f})
	if err != nil {
		return out, classify("listing the networks of instance "+inst, err, lifecycle.ErrNotFound)
	}
	var ours []network.Summary
	for _, nw := range nets.Items {
		// The filter is the engine's; the labels are checked again, as
		// every other removal of the runtime does.
		if nw.Labels[LabelManaged] == "true" && nw.Labels[LabelInstance] == inst {
			ours = append(ours, nw)
		}
	}
	if opts.Check != nil {
		for _, nw := range ours {
			if err := opts.Check(describeNetwork(&nw.Network)); err != nil {
				return out, err
			}
		}
	}
	if opts.Running != nil {
		for _, nw := range ours {
			if n := describeNetwork(&nw.Network); opts.Running(n) {
				return out, fmt.Errorf("%w: a gateway of instance %s is running (its DNS forwarder answers on %s, the gateway address of its network %s): stop it first, then uninstall",
					lifecycle.ErrConflict, inst, n.Gateway, n.Name)
			}
		}
	}

	cs, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return out, classify("listing the containers of instance "+inst, err, lifecycle.ErrNotFound)
	}
	for _, c := range cs.Items {
		if c.Labels[LabelManaged] != "true" || c.Labels[LabelInstance] != inst {
			continue
		}
		name := c.ID[:min(12, len(c.ID))]
		if len(c.Names) > 0 {
			name = strings.TrimPrefix(c.Names[0], "/")
		}
		if _, err := r.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: opts.Volumes}); err != nil && !cerrdefs.IsNotFound(err) {
			return out, classify("removing container "+name, err, lifecycle.ErrNotFound)
		}
		out.Containers = append(out.Containers, name)
	}

	if opts.Volumes {
		vs, err := r.cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
		if err != nil {
			return out, classify("listing the volumes of instance "+inst, err, lifecycle.ErrNotFound)
		}
		for _, v := range vs.Items {
			if v.Labels[LabelManaged] != "true" || v.Labels[LabelInstance] != inst {
				continue
			}
			if _, err := r.cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
				return out, classify("removing volume "+v.Name, err, lifecycle.ErrNotFound)
			}
			out.Volumes = append(out.Volumes, v.Name)
		}
	}

	sandboxNet := false
	for _, nw := range ours {
		sandboxNet = sandboxNet || nw.Name == r.opts.SandboxNetwork
		if _, err := r.cli.NetworkRemove(ctx, nw.ID, client.NetworkRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
			return out, classify("removing network "+nw.Name, err, lifecycle.ErrNotFound)
		}
		out.Networks = append(out.Networks, nw.Name)
		out.Bridges = append(out.Bridges, describeNetwork(&nw.Network).Bridge)
	}
	if !sandboxNet {
		// Removed before (docker network rm): its tables may be left. No
		// network bears its name now (not even another instance's), so
		// its bridge is nobody's.
		if _, err := r.cli.NetworkInspect(ctx, r.opts.SandboxNetwork, client.NetworkInspectOptions{}); cerrdefs.IsNotFound(err) {
			out.Bridges = append(out.Bridges, BridgeName(r.opts.SandboxNetwork))
		}
	}
	return out, nil
}

// describeNetwork is what Uninstall needs of a network: its name, bridge
// and gateway address.
func describeNetwork(nw *network.Network) lifecycle.SandboxNet {
	n := lifecycle.SandboxNet{Name: nw.Name, Bridge: nw.Options[networkBridgeName]}
	if n.Bridge == "" && len(nw.ID) >= 12 {
		n.Bridge = "br-" + nw.ID[:12]
	}
	for _, c := range nw.IPAM.Config {
		if c.Subnet.Addr().Is4() {
			n.Subnet = c.Subnet.Masked()
			n.Gateway = c.Gateway
			if !n.Gateway.IsValid() {
				n.Gateway = n.Subnet.Addr().Next()
			}
		}
	}
	return n
}
