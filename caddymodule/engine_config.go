package caddymodule

import (
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"

	core "github.com/sandwake/sandwake/engine"
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
	return ec.kind(), core.KubernetesOptions{
		Kubeconfig:   caddy.NewReplacer().ReplaceKnown(ec.Kubeconfig, ""),
		Namespace:    ec.Namespace,
		StorageClass: ec.StorageClass,
		VolumeSize:   ec.VolumeSize,
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
		running.StorageClass == want.StorageClass && running.VolumeSize == want.VolumeSize {
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
		if ec != nil && (ec.Kubeconfig != "" || ec.Namespace != "" || ec.StorageClass != "" || ec.VolumeSize != "") {
			return errors.New("sandwake: engine docker: kubeconfig, namespace, storage_class and volume_size are settings of engine kubernetes")
		}
		return nil
	case core.KindKubernetes:
	default:
		return fmt.Errorf("sandwake: engine %q is not docker or kubernetes", ec.Name)
	}
	_, k := ec.options()
	if err := k.Check(a.Instance); err != nil {
		return fmt.Errorf("sandwake: engine kubernetes: %w", err)
	}
	refuse := func(option, why string) error {
		return fmt.Errorf("sandwake: engine kubernetes: %s: %s", option, why)
	}
	// Fails closed: no egress policy is enforced on pods yet, and the
	// operator must say they accept that.
	if !a.EgressUnenforced {
		return refuse("egress policies cannot be enforced", "the egress firewall (nftables on the Docker host's sandbox bridge) does not apply to pods, which are on the cluster's network, "+
			"and egress through NetworkPolicy is not built yet; write `egress unenforced` in the sandwake block to run sandboxes whose egress nothing restricts (readyz and the start-up log then say so)")
	}
	switch {
	case len(a.EgressDeny) > 0:
		return refuse("egress_deny", "it configures the egress firewall, which does not apply to pods")
	case len(a.EgressAllowPrivate) > 0:
		return refuse("egress_allow_private", "it configures the egress firewall, which does not apply to pods")
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
	case len(a.Labels) > 0:
		return refuse("label", "the kubernetes engine does not put configured labels on its pods and claims yet (they carry sandwake.instance)")
	case a.Nofile != 0:
		return refuse("nofile", "Kubernetes has no per-pod open-file limit (the node's container runtime sets it)")
	case a.Pull == core.PullAlways:
		return refuse("pull always", "the kubernetes engine never pulls (imagePullPolicy Never): only images the nodes have are used")
	case len(a.AllowedRegistries) > 0:
		return refuse("allowed_registries", "the kubelet, not sandwake, would pull, and no registry check stands before it yet: the kubernetes engine uses only images the nodes have")
	case a.PoolMemoryMax != "":
		return refuse("pool_memory_max", "warm pools are not built on the kubernetes engine yet")
	case a.Cluster != nil:
		return refuse("cluster", "a cluster of gateways on the kubernetes engine is not built yet")
	}
	if a.MinFreeMemory == "" {
		a.MinFreeMemory = "0"
	} else if a.MinFreeMemory != "0" {
		return refuse("min_free_memory", "it reads the gateway host's memory, which says nothing of the nodes' where pods run (their memory is the scheduler's business)")
	}
	for _, tc := range a.Templates {
		if tc.Pool != nil {
			return refuse("template "+tc.Name, "warm pools are not built on the kubernetes engine yet")
		}
	}
	return nil
}
