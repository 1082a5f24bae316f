package caddymodule

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// unmarshalCluster parses the cluster block of the sandwake option (see
// parseGlobalOption); the dispenser is on the word cluster.
func unmarshalCluster(d *caddyfile.Dispenser) (*ClusterConfig, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	cc := new(ClusterConfig)
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return nil, d.Errf("cluster option %s is given twice (the second would silently replace the first)", opt)
		}
		seen[opt] = true
		switch opt {
		case "etcd":
			cc.Etcd = d.RemainingArgs()
			if len(cc.Etcd) == 0 {
				return nil, d.ArgErr()
			}
		case "node", "advertise", "advertise_api", "secret", "prefix":
			var v string
			if !d.AllArgs(&v) {
				return nil, d.ArgErr()
			}
			*map[string]*string{
				"node": &cc.Node, "advertise": &cc.Advertise, "advertise_api": &cc.AdvertiseAPI,
				"secret": &cc.Secret, "prefix": &cc.Prefix,
			}[opt] = v
		case "lease_ttl":
			var v string
			if !d.AllArgs(&v) {
				return nil, d.ArgErr()
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return nil, d.Errf("lease_ttl %q: want a positive duration", v)
			}
			cc.LeaseTTL = caddy.Duration(dur)
		default:
			return nil, d.Errf("unknown cluster option %q (etcd, node, advertise, advertise_api, secret, prefix, lease_ttl)", opt)
		}
	}
	return cc, nil
}
