package caddymodule

import (
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	core "github.com/sandwake/sandwake/engine"
)

// unmarshalEngine parses the engine option of the sandwake block (see
// parseGlobalOption); the dispenser is on the word engine.
//
//	engine docker
//	engine kubernetes {
//		kubeconfig       <path>
//		namespace        <namespace>
//		storage_class    <class>
//		volume_size      <quantity>
//		egress           networkpolicy
//		cluster_cidrs    <cidr>...
//		gateway_cidrs    <cidr>...
//		gateway_selector <key>=<value>...
//		node_selector    <key> <value>
//		toleration       <key>[=<value>] [<effect>]
//		runtime_class    <name>
//	}
//
// node_selector and toleration may be given more than once.
func unmarshalEngine(d *caddyfile.Dispenser) (*EngineConfig, error) {
	if !d.NextArg() {
		return nil, d.Err("engine: want docker or kubernetes")
	}
	ec := &EngineConfig{Name: d.Val()}
	if ec.Name != core.KindDocker && ec.Name != core.KindKubernetes {
		return nil, d.Errf("engine %q: want docker or kubernetes", ec.Name)
	}
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if ec.Name == core.KindDocker {
			return nil, d.Errf("engine docker takes no block (%s is a setting of engine kubernetes; Docker's settings are sandwake options: docker_host, upstream_mode, …)", opt)
		}
		if seen[opt] && opt != "node_selector" && opt != "toleration" {
			return nil, d.Errf("engine option %s is given twice (the second would silently replace the first)", opt)
		}
		seen[opt] = true
		var v string
		switch opt {
		case "kubeconfig", "namespace", "storage_class", "volume_size", "runtime_class", "egress":
			if !d.AllArgs(&v) {
				return nil, d.ArgErr()
			}
		case "node_selector":
			var key string
			if !d.AllArgs(&key, &v) {
				return nil, d.ArgErr()
			}
			if _, dup := ec.NodeSelector[key]; dup {
				return nil, d.Errf("node_selector %s is given twice", key)
			}
			if ec.NodeSelector == nil {
				ec.NodeSelector = map[string]string{}
			}
			ec.NodeSelector[key] = v
			continue
		case "toleration":
			args := d.RemainingArgs()
			if len(args) < 1 || len(args) > 2 {
				return nil, d.Err("toleration: want <key>[=<value>] [NoSchedule|PreferNoSchedule|NoExecute]")
			}
			var t core.Toleration
			if key, value, ok := strings.Cut(args[0], "="); ok {
				t.Key, t.Value = key, value
			} else if args[0] != "*" {
				t.Key = args[0]
			}
			if len(args) == 2 {
				t.Effect = args[1]
			}
			ec.Tolerations = append(ec.Tolerations, t)
			continue
		case "cluster_cidrs", "gateway_cidrs":
			l := d.RemainingArgs()
			if len(l) == 0 {
				return nil, d.ArgErr()
			}
			if opt == "cluster_cidrs" {
				ec.ClusterCIDRs = l
			} else {
				ec.GatewayCIDRs = l
			}
			continue
		case "gateway_selector":
			l := d.RemainingArgs()
			if len(l) == 0 {
				return nil, d.ArgErr()
			}
			ec.GatewaySelector = map[string]string{}
			for _, kv := range l {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return nil, d.Errf("gateway_selector %q: want key=value", kv)
				}
				ec.GatewaySelector[k] = v
			}
			continue
		default:
			return nil, d.Errf("unknown engine kubernetes option %q (kubeconfig, namespace, storage_class, volume_size, node_selector, toleration, runtime_class, egress, cluster_cidrs, gateway_cidrs, gateway_selector)", opt)
		}
		if opt == "egress" && v != core.KubernetesEgressNetworkPolicy {
			return nil, d.Errf("engine kubernetes: egress %q: want networkpolicy (to make no policy, write `egress unenforced` in the sandwake block)", v)
		}
		*map[string]*string{
			"kubeconfig": &ec.Kubeconfig, "namespace": &ec.Namespace,
			"storage_class": &ec.StorageClass, "volume_size": &ec.VolumeSize,
			"runtime_class": &ec.RuntimeClass,
			"egress":        &ec.Egress,
		}[opt] = v
	}
	return ec, nil
}
