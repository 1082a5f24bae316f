package caddymodule

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/caddyserver/caddy/v2"

	core "github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/lifecycle"
)

// EngineConfig chooses the container engine sandboxes run on (the engine
// option). Changing it needs a restart.
type EngineConfig struct {
	// Name is the engine: "docker" (containers on a Docker Engine,
	// docker_host) or "kubernetes" (a pod and a PersistentVolumeClaim per
	// sandbox in Namespace, through the API server). Default: docker.
	Name string `json:"name,omitempty"`
	// Kubeconfig is the path of the kubeconfig file the kubernetes engine
	// uses; placeholders such as {env.KUBECONFIG} are replaced. Default:
	// the pod's service account when the gateway runs in the cluster, else
	// $KUBECONFIG, else ~/.kube/config.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Namespace holds every sandbox's pod and claim (kubernetes). It must
	// exist. Default: sandwake.
	Namespace string `json:"namespace,omitempty"`
	// StorageClass is the storage class of the sandboxes' workspace claims
	// (kubernetes). Default: the cluster's default class.
	StorageClass string `json:"storage_class,omitempty"`
	// VolumeSize is the size each workspace claim asks for, as a
	// Kubernetes quantity such as 1Gi or 500Mi (kubernetes). Default: 1Gi.
	VolumeSize string `json:"volume_size,omitempty"`
	// NodeSelector places the sandboxes' pods on nodes with these labels
	// (kubernetes).
	NodeSelector map[string]string `json:"node_selector,omitempty"`
	// Tolerations let the sandboxes' pods onto nodes with matching taints
	// (kubernetes): a node pool kept for untrusted code.
	Tolerations []core.Toleration `json:"tolerations,omitempty"`
	// RuntimeClass is the RuntimeClass of the pods of sandboxes that name
	// no runtime (kubernetes): gVisor or Kata, as runtime runsc is for
	// Docker. Default: the cluster's default.
	RuntimeClass string `json:"runtime_class,omitempty"`
	// Egress is how the kubernetes engine enforces sandboxes' egress
	// policies: "networkpolicy", a NetworkPolicy per sandbox, made before
	// its pod and enforced where the cluster's network plugin enforces
	// NetworkPolicy. `egress unenforced` in the sandwake block makes none.
	// Default: networkpolicy.
	Egress string `json:"egress,omitempty"`
	// ClusterCIDRs are the cluster's pod and service ranges (IPv4 CIDRs,
	// and the nodes' when they are public addresses): a public policy does
	// not reach them and no allow entry opens them. Ranges inside the
	// private ones (10.0.0.0/8, …) are denied already. Default: none.
	ClusterCIDRs []string `json:"cluster_cidrs,omitempty"`
	// GatewayCIDRs are the addresses of a gateway that runs outside the
	// cluster, as the pods see its connections (the node's bridge address
	// for a gateway on the node): they may reach the sandboxes' ports.
	// Default: none (only the gateway's pods).
	GatewayCIDRs []string `json:"gateway_cidrs,omitempty"`
	// GatewaySelector is the labels of the gateway's pods, in any
	// namespace: they alone (and GatewayCIDRs) reach the sandboxes' ports.
	// Default: app.kubernetes.io/name=sandwake and
	// app.kubernetes.io/component=gateway.
	GatewaySelector map[string]string `json:"gateway_selector,omitempty"`
}

// kubernetesSettings reports whether ec sets anything only the kubernetes
// engine reads.
func (ec *EngineConfig) kubernetesSettings() bool {
	return ec != nil && (ec.Kubeconfig != "" || ec.Namespace != "" || ec.StorageClass != "" || ec.VolumeSize != "" ||
		len(ec.NodeSelector) > 0 || len(ec.Tolerations) > 0 || ec.RuntimeClass != "" ||
		ec.Egress != "" || len(ec.ClusterCIDRs) > 0 || len(ec.GatewayCIDRs) > 0 || ec.GatewaySelector != nil)

}

// parseCIDRs parses the CIDRs (or addresses) of an engine option.
func parseCIDRs(option string, l []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(l))
	for _, c := range l {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			a, aerr := netip.ParseAddr(c)
			if aerr != nil {
				return nil, fmt.Errorf("%s %q is not a CIDR or address", option, c)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// kind is the engine's name, docker when unset.
func (ec *EngineConfig) kind() string {
	if ec == nil || ec.Name == "" {
		return core.KindDocker
	}
	return ec.Name
}

// options are the engine package's options for this config.
func (ec *EngineConfig) options() (kind string, k core.KubernetesOptions) {
	if ec == nil {
		return core.KindDocker, k
	}
	// The ranges were checked by provisionEngine.
	cluster, _ := parseCIDRs("cluster_cidrs", ec.ClusterCIDRs)
	gateway, _ := parseCIDRs("gateway_cidrs", ec.GatewayCIDRs)
	return ec.kind(), core.KubernetesOptions{
		Kubeconfig:      caddy.NewReplacer().ReplaceKnown(ec.Kubeconfig, ""),
		Namespace:       ec.Namespace,
		StorageClass:    ec.StorageClass,
		VolumeSize:      ec.VolumeSize,
		Egress:          ec.Egress,
		ClusterCIDRs:    cluster,
		GatewayCIDRs:    gateway,
		GatewaySelector: ec.GatewaySelector,
		NodeSelector:    ec.NodeSelector,
		Tolerations:     ec.Tolerations,
		RuntimeClass:    ec.RuntimeClass,
	}
}

// engineChanges describes how the engine option changed from the one the
// running engine opened with ("" when it did not).
func engineChanges(running EngineConfig, next *EngineConfig) string {
	var want EngineConfig
	if next != nil {
		want = *next
	}
	if running.kind() == want.kind() && running.Kubeconfig == want.Kubeconfig && running.Namespace == want.Namespace &&
		running.StorageClass == want.StorageClass && running.VolumeSize == want.VolumeSize && running.Egress == want.Egress &&
		slices.Equal(running.ClusterCIDRs, want.ClusterCIDRs) && slices.Equal(running.GatewayCIDRs, want.GatewayCIDRs) &&
		maps.Equal(running.GatewaySelector, want.GatewaySelector) &&
		maps.Equal(running.NodeSelector, want.NodeSelector) && slices.Equal(running.Tolerations, want.Tolerations) &&
		running.RuntimeClass == want.RuntimeClass {
		return ""
	}
	return fmt.Sprintf("engine %s changed (running: %s)", want.kind(), running.kind())
}

// provisionEngine checks the engine option and, with kubernetes, refuses
// every setting the kubernetes engine cannot honour (rather than run
// without it), and turns min_free_memory off by default: the gateway's
// host memory says nothing of the nodes' (the scheduler's business).
func (a *App) provisionEngine() error {
	ec := a.Engine
	switch ec.kind() {
	case core.KindDocker:
		if ec.kubernetesSettings() {
			return errors.New("sandwake: engine docker: kubeconfig, namespace, storage_class, volume_size, node_selector, toleration, runtime_class, egress, cluster_cidrs, gateway_cidrs and gateway_selector are settings of engine kubernetes")
		}
		return nil
	case core.KindKubernetes:
	default:
		return fmt.Errorf("sandwake: engine %q is not docker or kubernetes", ec.Name)
	}
	refuse := func(option, why string) error {
		return fmt.Errorf("sandwake: engine kubernetes: %s: %s", option, why)
	}
	if _, err := parseCIDRs("cluster_cidrs", ec.ClusterCIDRs); err != nil {
		return refuse("cluster_cidrs", err.Error())
	}
	if _, err := parseCIDRs("gateway_cidrs", ec.GatewayCIDRs); err != nil {
		return refuse("gateway_cidrs", err.Error())
	}
	switch {
	case ec.Egress == core.KubernetesEgressUnenforced:
		return refuse("egress unenforced", "write `egress unenforced` in the sandwake block (readyz and the start-up log then say so), not in the engine's")
	case ec.Egress != "" && a.EgressUnenforced:
		return refuse("egress "+ec.Egress, "the sandwake block says `egress unenforced`: no policy is made; remove one of the two")
	}
	_, k := ec.options()
	if err := k.Check(a.Instance); err != nil {
		return fmt.Errorf("sandwake: engine kubernetes: %w", err)
	}
	if !a.EgressUnenforced {
		// A NetworkPolicy holds addresses: what needs names is refused
		// now rather than at every create.
		if a.Egress == lifecycle.EgressLearn {
			return refuse("egress learn", "learn records the names sandboxes look up, which a NetworkPolicy does not see; use public or none")
		}
		for _, e := range a.EgressAllow {
			if r, err := lifecycle.ParseAllowRule(e); err == nil && r.IsName() {
				return refuse("egress_allow "+e, "a name: a NetworkPolicy holds addresses only (names need a policy engine that resolves them, which sandwake does not drive yet)")
			}
		}
	}
	switch {
	case len(a.EgressDeny) > 0:
		return refuse("egress_deny", "it configures the egress firewall of engine docker; give the ranges pods must not reach as the engine's cluster_cidrs")
	case len(a.EgressAllowPrivate) > 0:
		return refuse("egress_allow_private", "it configures the egress firewall of engine docker, which does not apply to pods")
	case len(a.EgressDNS) > 0:
		return refuse("egress_dns", "it configures the egress firewall's DNS forwarder, which does not apply to pods (they use the cluster's DNS)")
	case a.DockerHost != "":
		return refuse("docker_host", "a setting of engine docker")
	case a.UpstreamMode != "" || a.Network != "":
		return refuse("upstream_mode", "a setting of engine docker: the gateway dials each pod at its own address")
	case a.SandboxNetwork != "":
		return refuse("sandbox_network", "a setting of engine docker: pods are on the cluster's network")
	case a.SandboxSubnet != "":
		return refuse("sandbox_subnet", "a setting of engine docker: pod addresses are the cluster's")
	case a.Nofile != 0:
		return refuse("nofile", "Kubernetes has no per-pod open-file limit (the node's container runtime sets it)")
	case a.Pull == core.PullAlways:
		return refuse("pull always", "the kubernetes engine never pulls (imagePullPolicy Never): only images the nodes have are used")
	case len(a.AllowedRegistries) > 0:
		return refuse("allowed_registries", "the kubelet, not sandwake, would pull, and no registry check stands before it yet: the kubernetes engine uses only images the nodes have")
	}
	if err := core.CheckKubernetesLabels(a.Labels); err != nil {
		return refuse("label", err.Error()+" (the pods, claims and NetworkPolicies carry the configured labels)")
	}
	if a.MinFreeMemory == "" {
		a.MinFreeMemory = "0"
	} else if a.MinFreeMemory != "0" {
		return refuse("min_free_memory", "it reads the gateway host's memory, which says nothing of the nodes' where pods run (their memory is the scheduler's business)")
	}
	for _, tc := range a.Templates {
		if e := tc.Egress; e != nil && !a.EgressUnenforced {
			if e.Policy == lifecycle.EgressLearn {
				return refuse("template "+tc.Name, "egress learn records the names sandboxes look up, which a NetworkPolicy does not see; use public or none")
			}
			for _, entry := range slices.Concat(e.Allow, e.Deny) {
				if r, err := lifecycle.ParseAllowRule(entry); err == nil && r.IsName() {
					return refuse("template "+tc.Name, "egress entry "+entry+" is a name: a NetworkPolicy holds addresses only (names need a policy engine that resolves them, which sandwake does not drive yet)")
				}
			}
		}
	}
	return nil
}
