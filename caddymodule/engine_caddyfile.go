package caddymodule

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	core "github.com/sandwake/sandwake/engine"
)

// unmarshalEngine parses the engine option of the sandwake block (see
// parseGlobalOption); the dispenser is on the word engine.
//
//	engine docker
//	engine kubernetes {
//		kubeconfig    <path>
//		namespace     <namespace>
//		storage_class <class>
//		volume_size   <quantity>
//	}
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
		if seen[opt] {
			return nil, d.Errf("engine option %s is given twice (the second would silently replace the first)", opt)
		}
		seen[opt] = true
		var v string
		switch opt {
		case "kubeconfig", "namespace", "storage_class", "volume_size":
			if !d.AllArgs(&v) {
				return nil, d.ArgErr()
			}
		default:
			return nil, d.Errf("unknown engine kubernetes option %q (kubeconfig, namespace, storage_class, volume_size)", opt)
		}
		*map[string]*string{
			"kubeconfig": &ec.Kubeconfig, "namespace": &ec.Namespace,
			"storage_class": &ec.StorageClass, "volume_size": &ec.VolumeSize,
		}[opt] = v
	}
	return ec, nil
}
