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
		case "backend", "kubeconfig", "namespace",
			"node", "peer_listen", "advertise", "secret", "prefix",
			"peer_ca_file", "peer_cert_file", "peer_key_file", "peer_ca_key_file",
			"etcd_ca_file", "etcd_cert_file", "etcd_key_file", "etcd_username", "etcd_password_file":
			var v string
			if !d.AllArgs(&v) {
				return nil, d.ArgErr()
			}
			*map[string]*string{
				"backend": &cc.Backend, "kubeconfig": &cc.Kubeconfig, "namespace": &cc.Namespace,
				"peer_ca_key_file": &cc.PeerCAKeyFile, "node": &cc.Node, "peer_listen": &cc.PeerListen, "advertise": &cc.Advertise,
				"secret": &cc.Secret, "prefix": &cc.Prefix,
				"peer_ca_file": &cc.PeerCAFile, "peer_cert_file": &cc.PeerCertFile, "peer_key_file": &cc.PeerKeyFile,
				"etcd_ca_file": &cc.EtcdCAFile, "etcd_cert_file": &cc.EtcdCertFile, "etcd_key_file": &cc.EtcdKeyFile,
				"etcd_username": &cc.EtcdUsername, "etcd_password_file": &cc.EtcdPasswordFile,
			}[opt] = v
		case "advertise_api":
			return nil, d.Err("cluster option advertise_api is gone: the other nodes reach this node's API through its peer listener " +
				"(peer_listen; advertise now names that listener as they dial it), over mutual TLS with node certificates (peer_ca_file, peer_cert_file, peer_key_file)")
		case "insecure_plaintext":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			cc.InsecurePlaintext = true
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
			return nil, d.Errf("unknown cluster option %q (backend, kubeconfig, namespace, etcd, node, peer_listen, advertise, peer_ca_file, peer_cert_file, peer_key_file, peer_ca_key_file, secret, prefix, lease_ttl, etcd_ca_file, etcd_cert_file, etcd_key_file, etcd_username, etcd_password_file, insecure_plaintext)", opt)
		}
	}
	return cc, nil
}
