package caddymodule

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/cluster/peer"
	core "github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/preview"
)

// ClusterConfig is the cluster block of the sandwake app: the gateway joins a
// cluster of nodes sharing one sandbox catalog in etcd, and serves every
// sandbox of the cluster (see the README, "Cluster"). Without it the gateway
// is a single host and nothing of the cluster runs.
type ClusterConfig struct {
	// Backend is where the cluster keeps its registry and catalog: etcd
	// (the default; Etcd names it) or kubernetes (the Kubernetes API: one
	// Lease per node, per drain mark and per sandbox in Namespace; no etcd
	// of the cluster's own).
	Backend string `json:"backend,omitempty"`
	// Kubeconfig is the kubeconfig file of backend kubernetes. Default:
	// the engine's kubeconfig; else in the cluster (the pod's service
	// account), else $KUBECONFIG or ~/.kube/config.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Namespace holds the Leases of backend kubernetes. Default: the
	// engine's namespace (engine kubernetes), else the pod's own.
	Namespace string `json:"namespace,omitempty"`
	// Etcd are the client URLs of the etcd cluster, e.g.
	// https://10.0.0.5:2379 (http:// only with insecure_plaintext).
	// Required with backend etcd.
	Etcd []string `json:"etcd,omitempty"`
	// Node is this node's name, unique in the cluster; it is also the
	// gateway's instance name (an instance option, if given, must equal
	// it). 1-63 characters of [a-z0-9_.-]. Default: the host name,
	// lowercased.
	Node string `json:"node,omitempty"`
	// PeerListen is the address of this node's peer listener, e.g.
	// 10.0.0.11:7443: the other nodes send it the preview requests and
	// API calls for this node's sandboxes, over mutual TLS (a client
	// certificate of the cluster CA naming a node is required). It
	// serves nothing else. Required.
	PeerListen string `json:"peer_listen,omitempty"`
	// Advertise is host:port of the peer listener as the other nodes
	// dial it; the node certificate must cover its host (an IP or DNS
	// SAN). Default: peer_listen, when that names a host.
	Advertise string `json:"advertise,omitempty"`
	// PeerCAFile is the PEM file of the cluster CA (made by `caddy
	// sandwake cluster ca`); with several CAs in it (the old and the new,
	// during a CA rotation) a certificate of any of them is accepted.
	// Re-read at each config reload. Required.
	PeerCAFile string `json:"peer_ca_file,omitempty"`
	// PeerCertFile is this node's certificate (made by `caddy sandwake
	// cluster cert`), issued by the cluster CA for this node's name (URI
	// SAN sandwake://node/<node>) and its advertised host, for server and
	// client use. Re-read at each config reload: a renewed certificate
	// takes effect with a reload. Required.
	PeerCertFile string `json:"peer_cert_file,omitempty"`
	// PeerKeyFile is the key of PeerCertFile, readable by the gateway's
	// user only. Required.
	PeerKeyFile string `json:"peer_key_file,omitempty"`
	// PeerCAKeyFile is the cluster CA's key, instead of PeerCertFile and
	// PeerKeyFile: the node issues its own certificate at each config
	// load, for its name and its advertised host (a pod whose address is
	// known only once it runs). Every node holding it can issue any
	// node's certificate: give it to gateways alone (a Secret mounted
	// only in their pods).
	PeerCAKeyFile string `json:"peer_ca_key_file,omitempty"`
	// Secret signs node-to-node requests inside the mutual TLS, a second
	// factor besides the node certificates; every node has the same, at
	// least 16 bytes once placeholders such as
	// {env.SANDWAKE_CLUSTER_SECRET} are replaced. Required.
	Secret string `json:"secret,omitempty"`
	// Prefix is the key prefix of the cluster in etcd. Default: /sandwake/.
	Prefix string `json:"prefix,omitempty"`
	// LeaseTTL is how long a node may be silent before the others take
	// it for lost. Default: 10s.
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
	// EtcdCAFile is the PEM file of the CA that signed etcd's server
	// certificates. Default: the system's roots.
	EtcdCAFile string `json:"etcd_ca_file,omitempty"`
	// EtcdCertFile and EtcdKeyFile are this node's client certificate and
	// key for etcd's --client-cert-auth. Both or neither.
	EtcdCertFile string `json:"etcd_cert_file,omitempty"`
	EtcdKeyFile  string `json:"etcd_key_file,omitempty"`
	// EtcdUsername and EtcdPasswordFile authenticate to etcd when its auth
	// is enabled (the password is the file's first line). Both or neither.
	EtcdUsername     string `json:"etcd_username,omitempty"`
	EtcdPasswordFile string `json:"etcd_password_file,omitempty"`
	// InsecurePlaintext allows http:// etcd endpoints: anyone on the
	// network between the node and etcd can read and forge the catalog
	// that routes every preview. Flagged in readyz and at start. Default:
	// false (only https:// endpoints).
	InsecurePlaintext bool `json:"insecure_plaintext,omitempty"`

	secret   []byte
	tls      *tls.Config
	password string
	// creds are the node's peer credentials as this config read them.
	creds *cluster.Credentials
	// kube is backend kubernetes's client, made by provision.
	kube *cluster.KubeBackend
	// previews are the HTTP servers of this config with a sandwake_preview
	// route, and api a sandwake_api handler of it: the peer listener hands
	// them the forwarded requests (registerPreview, registerAPI).
	previews []*caddyhttp.Server
	api      http.Handler
}

// provision fills the cluster block's defaults and makes the node name the
// instance name.
func (c *ClusterConfig) provision(a *App) error {
	c.secret = []byte(caddy.NewReplacer().ReplaceKnown(c.Secret, ""))
	if c.Node == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("sandwake: cluster: node is not set and the host name cannot be read: %w", err)
		}
		c.Node = strings.ToLower(host)
	}
	if c.Prefix == "" {
		c.Prefix = cluster.DefaultPrefix
	}
	if err := c.provisionBackend(a); err != nil {
		return err
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = caddy.Duration(cluster.DefaultLeaseTTL)
	}
	if a.Instance != "" && a.Instance != c.Node {
		return fmt.Errorf("sandwake: instance %q and cluster node %q differ: a node's name is its instance name (drop instance, or make them equal)", a.Instance, c.Node)
	}
	a.Instance = c.Node
	if c.Advertise == "" {
		// The peer listener's own address, unless it binds every address.
		if host, _, err := net.SplitHostPort(c.PeerListen); err == nil && host != "" {
			if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
				c.Advertise = c.PeerListen
			}
		}
	}
	if err := c.provisionEtcdAuth(); err != nil {
		return err
	}
	return c.provisionPeerCredentials()
}

// serviceAccountNamespace is where a pod reads its own namespace.
var serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// provisionBackend fills backend kubernetes's namespace and kubeconfig from
// the engine block and the pod, and makes its client (which contacts
// nothing yet).
func (c *ClusterConfig) provisionBackend(a *App) error {
	switch c.Backend {
	case "", "etcd":
		c.Backend = "etcd"
		return nil
	case "kubernetes":
	default:
		return fmt.Errorf("sandwake: cluster: backend %q: want etcd or kubernetes", c.Backend)
	}
	if a.Engine != nil && a.Engine.kind() == core.KindKubernetes {
		if c.Namespace == "" {
			c.Namespace = a.Engine.Namespace
		}
		if c.Kubeconfig == "" {
			c.Kubeconfig = a.Engine.Kubeconfig
		}
	}
	if c.Namespace == "" {
		if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
			c.Namespace = strings.TrimSpace(string(b))
		}
	}
	if c.Namespace == "" {
		return errors.New("sandwake: cluster: backend kubernetes needs a namespace (namespace in the cluster block, or engine kubernetes's, or the pod's own when the gateway runs in the cluster)")
	}
	cli, server, err := core.KubernetesClient(caddy.NewReplacer().ReplaceKnown(c.Kubeconfig, ""))
	if err != nil {
		return fmt.Errorf("sandwake: cluster: backend kubernetes: %w", err)
	}
	c.kube = &cluster.KubeBackend{Client: cli, Namespace: c.Namespace, Server: server}
	return nil
}

// provisionPeerCredentials reads the node's certificate and the cluster CA
// (at every config load: a reload picks up renewed files), or issues the
// certificate with the CA's key (peer_ca_key_file).
func (c *ClusterConfig) provisionPeerCredentials() error {
	if c.PeerCAKeyFile != "" && c.PeerCAFile != "" && c.PeerCertFile == "" && c.PeerKeyFile == "" {
		return c.issuePeerCredentials()
	}
	if c.PeerCAFile == "" || c.PeerCertFile == "" || c.PeerKeyFile == "" {
		return nil // validate names what is missing
	}
	if err := checkPrivateFile("peer_key_file", c.PeerKeyFile); err != nil {
		return err
	}
	creds, err := cluster.LoadCredentials(c.PeerCAFile, c.PeerCertFile, c.PeerKeyFile, time.Now())
	if err != nil {
		return fmt.Errorf("sandwake: cluster: peer_ca_file, peer_cert_file, peer_key_file: %w", err)
	}
	c.creds = creds
	return nil
}

// issuePeerCredentials issues this node's certificate with the cluster
// CA's key, for its name and advertised host, valid for
// cluster.DefaultNodeValidity: a node restarted or reloaded gets a fresh
// one.
func (c *ClusterConfig) issuePeerCredentials() error {
	host, _, err := net.SplitHostPort(c.Advertise)
	if err != nil || host == "" {
		return nil // validate says what advertise lacks
	}
	creds, err := c.issue(host)
	if err != nil {
		return err
	}
	c.creds = creds
	return nil
}

// issue issues this node's credentials for host with the CA's key (read
// again each time: a rotated Secret takes effect at the next renewal).
func (c *ClusterConfig) issue(host string) (*cluster.Credentials, error) {
	caKey, err := readPrivateFile("peer_ca_key_file", c.PeerCAKeyFile)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(c.PeerCAFile)
	if err != nil {
		return nil, fmt.Errorf("sandwake: cluster: peer_ca_file: %w", err)
	}
	now := time.Now()
	// The bundle's first certificate is the CA that issues (the current
	// one during a rotation); every one of them is trusted.
	certPEM, keyPEM, err := cluster.IssueNodeCert(caPEM, caKey, cluster.NodeCertRequest{Node: c.Node, Hosts: []string{host}}, now)
	if err != nil {
		return nil, fmt.Errorf("sandwake: cluster: issuing this node's certificate with peer_ca_key_file %s (the CA must be peer_ca_file's first certificate): %w", c.PeerCAKeyFile, err)
	}
	creds, err := cluster.NewCredentials(caPEM, certPEM, keyPEM, now)
	if err != nil {
		return nil, fmt.Errorf("sandwake: cluster: the certificate issued with peer_ca_key_file: %w", err)
	}
	return creds, nil
}

// provisionEtcdAuth reads the etcd client's TLS files and password.
func (c *ClusterConfig) provisionEtcdAuth() error {
	if (c.EtcdCertFile == "") != (c.EtcdKeyFile == "") {
		return errors.New("sandwake: cluster: etcd_cert_file and etcd_key_file go together")
	}
	if (c.EtcdUsername == "") != (c.EtcdPasswordFile == "") {
		return errors.New("sandwake: cluster: etcd_username and etcd_password_file go together")
	}
	if c.EtcdPasswordFile != "" {
		b, err := readPrivateFile("etcd_password_file", c.EtcdPasswordFile)
		if err != nil {
			return err
		}
		c.password, _, _ = strings.Cut(string(b), "\n")
		c.password = strings.TrimRight(c.password, "\r")
		if c.password == "" {
			return fmt.Errorf("sandwake: cluster: etcd_password_file %s is empty", c.EtcdPasswordFile)
		}
	}
	if c.EtcdCAFile == "" && c.EtcdCertFile == "" {
		if len(c.Etcd) > 0 && strings.HasPrefix(c.Etcd[0], "https://") {
			c.tls = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		return nil
	}
	c.tls = &tls.Config{MinVersion: tls.VersionTLS12}
	if c.EtcdCAFile != "" {
		pem, err := os.ReadFile(c.EtcdCAFile)
		if err != nil {
			return fmt.Errorf("sandwake: cluster: etcd_ca_file: %w", err)
		}
		c.tls.RootCAs = x509.NewCertPool()
		if !c.tls.RootCAs.AppendCertsFromPEM(pem) {
			return fmt.Errorf("sandwake: cluster: etcd_ca_file %s holds no PEM certificate", c.EtcdCAFile)
		}
	}
	if c.EtcdCertFile != "" {
		if err := checkPrivateFile("etcd_key_file", c.EtcdKeyFile); err != nil {
			return err
		}
		cert, err := tls.LoadX509KeyPair(c.EtcdCertFile, c.EtcdKeyFile)
		if err != nil {
			return fmt.Errorf("sandwake: cluster: etcd_cert_file/etcd_key_file: %w", err)
		}
		c.tls.Certificates = []tls.Certificate{cert}
	}
	return nil
}

// checkPrivateFile refuses a secret file (a key, a password) that every
// user of the host may read: it was meant to be the gateway's alone.
func checkPrivateFile(option, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("sandwake: cluster: %s: %w", option, err)
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return fmt.Errorf("sandwake: cluster: %s %s is readable by every user (mode %04o): make it readable by the gateway's user only (chmod 600; a Kubernetes secret volume: defaultMode 0400)",
			option, path, fi.Mode().Perm())
	}
	return nil
}

// readPrivateFile reads a secret file that checkPrivateFile accepts.
func readPrivateFile(option, path string) ([]byte, error) {
	if err := checkPrivateFile(option, path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sandwake: cluster: %s: %w", option, err)
	}
	return b, nil
}

// validate checks the cluster block once provisioned.
func (c *ClusterConfig) validate() error {
	if c.Backend == "kubernetes" {
		if len(c.Etcd) > 0 || c.EtcdCAFile != "" || c.EtcdCertFile != "" || c.EtcdUsername != "" || c.InsecurePlaintext {
			return errors.New("sandwake: cluster: etcd, etcd_ca_file, etcd_cert_file, etcd_key_file, etcd_username, etcd_password_file and insecure_plaintext are settings of backend etcd, not kubernetes")
		}
		return c.validateNode()
	}
	if c.Kubeconfig != "" || c.Namespace != "" {
		return errors.New("sandwake: cluster: kubeconfig and namespace are settings of backend kubernetes")
	}
	if len(c.Etcd) == 0 {
		return errors.New("sandwake: cluster: etcd needs at least one client URL")
	}
	schemes := map[string]bool{}
	for _, ep := range c.Etcd {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("sandwake: cluster: etcd %q is not an http(s) URL", ep)
		}
		schemes[u.Scheme] = true
	}
	switch {
	case len(schemes) > 1:
		return errors.New("sandwake: cluster: etcd endpoints mix http:// and https://: give all of them one scheme (https)")
	case schemes["http"] && !c.InsecurePlaintext:
		return fmt.Errorf("sandwake: cluster: etcd %s is plaintext http: anyone on that network can read and forge the catalog that routes every preview. "+
			"Run etcd with TLS and client certificates and give https:// endpoints with etcd_ca_file, etcd_cert_file and etcd_key_file, "+
			"or write insecure_plaintext in the cluster block to accept the risk", c.Etcd[0])
	case schemes["https"] && c.InsecurePlaintext:
		return errors.New("sandwake: cluster: insecure_plaintext is set but the etcd endpoints are https://: remove it")
	case schemes["http"] && (c.EtcdCAFile != "" || c.EtcdCertFile != ""):
		return errors.New("sandwake: cluster: etcd_ca_file and etcd_cert_file need https:// endpoints")
	}
	return c.validateNode()
}

// validateNode checks the node's name, listener and credentials (either
// backend).
func (c *ClusterConfig) validateNode() error {
	if !lifecycle.ValidInstance(c.Node) {
		return fmt.Errorf("sandwake: cluster: node %q: want 1-63 characters of [a-z0-9_.-] starting with a letter or digit", c.Node)
	}
	if c.PeerListen == "" {
		return errors.New("sandwake: cluster: peer_listen is required (the address the other nodes forward this node's requests to, over mutual TLS)")
	}
	if _, port, err := net.SplitHostPort(c.PeerListen); err != nil || port == "" {
		return fmt.Errorf("sandwake: cluster: peer_listen %q is not [host]:port", c.PeerListen)
	}
	if c.Advertise == "" {
		return fmt.Errorf("sandwake: cluster: advertise is required when peer_listen %s binds every address (host:port the other nodes dial)", c.PeerListen)
	}
	if host, port, err := net.SplitHostPort(c.Advertise); err != nil || host == "" || port == "" {
		return fmt.Errorf("sandwake: cluster: advertise %q is not host:port", c.Advertise)
	}
	if c.PeerCAKeyFile != "" && (c.PeerCertFile != "" || c.PeerKeyFile != "") {
		return errors.New("sandwake: cluster: peer_ca_key_file issues this node's certificate: give it instead of peer_cert_file and peer_key_file, not with them")
	}
	if c.PeerCAFile == "" || ((c.PeerCertFile == "" || c.PeerKeyFile == "") && c.PeerCAKeyFile == "") {
		return errors.New("sandwake: cluster: peer_ca_file, peer_cert_file and peer_key_file are required (or peer_ca_file and peer_ca_key_file, to issue the certificate at load): " +
			"make a cluster CA with `caddy sandwake cluster ca` and this node's certificate with `caddy sandwake cluster cert`")
	}
	if c.creds.Node != c.Node {
		return fmt.Errorf("sandwake: cluster: peer_cert_file %s is node %s's certificate, but this node is %s", c.PeerCertFile, c.creds.Node, c.Node)
	}
	host, _, _ := net.SplitHostPort(c.Advertise)
	if err := c.creds.Cert.Leaf.VerifyHostname(host); err != nil {
		return fmt.Errorf("sandwake: cluster: peer_cert_file %s does not cover the advertised host %s (the other nodes would refuse it): issue one with --addr %s", c.PeerCertFile, host, host)
	}
	if c.Secret == "" {
		return errors.New("sandwake: cluster: secret is required (the same on every node)")
	}
	if len(c.secret) < 16 {
		return errors.New("sandwake: cluster: secret must be at least 16 bytes once placeholders are replaced")
	}
	if c.LeaseTTL < caddy.Duration(time.Second) {
		return errors.New("sandwake: cluster: lease_ttl must be at least 1s")
	}
	return nil
}

// joinCluster builds the engine's cluster client (contacting nothing) when
// the config has a cluster block. It runs before the manager starts, so that
// no change escapes the publisher.
func (e *engine) joinCluster(a *App) error {
	if a.Cluster == nil {
		return nil
	}
	cc := a.Cluster
	peers := cluster.NewPeerTLS(cc.creds)
	c, err := cluster.New(cluster.Config{
		Endpoints: cc.Etcd, Kubernetes: cc.kube, Node: cc.Node, Advertise: cc.Advertise, Peers: peers,
		Secret: cc.secret, Prefix: cc.Prefix, LeaseTTL: time.Duration(cc.LeaseTTL),
		Logger: e.Log.Named("cluster"),
		TLS:    cc.tls, Username: cc.EtcdUsername, Password: cc.password,
	}, peer.Source{Mgr: e.Mgr, Limits: &e.Limits, NoHostMemory: a.Engine.kind() == core.KindKubernetes})
	if cc.InsecurePlaintext {
		e.Log.Warn("cluster: etcd over plaintext http (insecure_plaintext): anyone on the network between this node and etcd can read and forge the catalog that routes every preview",
			zap.Strings("etcd", cc.Etcd))
	}
	if err != nil {
		return fmt.Errorf("sandwake: cluster: %w", err)
	}
	e.applyCapacity(a)
	cs := peer.NewNode(c, peers, e.Log, preview.CountUnsignedForward)
	cs.Plaintext = cc.InsecurePlaintext
	// Set again by every config's Start (applyCluster); set here too, so
	// that the node serves its peers from the moment it registers.
	cs.SetTargets(cc.previewServer(), cc.api)
	e.Cluster = cs
	joined := *cc
	e.clusterCfg = &joined
	return nil
}

// clusterChanges says how cluster block next differs from prev, the one the
// engine joined with ("" when they are the same). The membership is fixed
// when the engine opens, which a reload does not do; the peer credentials
// are not part of it (a reload reads them again: that is how a renewed
// certificate or CA bundle takes effect).
func clusterChanges(prev, next *ClusterConfig) string {
	switch {
	case prev == nil && next == nil:
		return ""
	case prev == nil:
		return "a cluster block was added"
	case next == nil:
		return "the cluster block was removed"
	}
	var changed []string
	for _, f := range []struct {
		name string
		same bool
	}{
		{"backend", prev.Backend == next.Backend},
		{"kubeconfig", prev.Kubeconfig == next.Kubeconfig},
		{"namespace", prev.Namespace == next.Namespace},
		{"etcd", slices.Equal(prev.Etcd, next.Etcd)},
		{"node", prev.Node == next.Node},
		{"peer_listen", prev.PeerListen == next.PeerListen},
		{"advertise", prev.Advertise == next.Advertise},
		{"secret", bytes.Equal(prev.secret, next.secret)},
		{"prefix", prev.Prefix == next.Prefix},
		{"lease_ttl", prev.LeaseTTL == next.LeaseTTL},
	} {
		if !f.same {
			changed = append(changed, f.name)
		}
	}
	if len(changed) == 0 {
		return ""
	}
	return "cluster " + strings.Join(changed, ", ") + " changed"
}

// startCluster opens the peer listener and joins the cluster once the
// manager runs.
func (e *engine) startCluster() error {
	if e.Cluster == nil {
		return nil
	}
	return e.Cluster.Start(e.clusterCfg.PeerListen)
}

// applyCluster publishes a config's cluster settings to the running
// engine: its capacity limits and, in a cluster, the peer credentials it
// read (a renewed certificate, a new CA bundle) and the handlers its peer
// listener serves.
func (e *engine) applyCluster(a *App) {
	e.applyCapacity(a)
	if e.Cluster == nil || a.Cluster == nil {
		return
	}
	cc := a.Cluster
	e.Cluster.Peers.Store(cc.creds)
	// A certificate the node issues itself is renewed at half its life;
	// one from files is the operator's to renew (warned below).
	e.Cluster.Peers.SetRenewal(nil)
	if cc.PeerCAKeyFile != "" {
		host, _, _ := net.SplitHostPort(cc.Advertise)
		log := e.Log
		e.Cluster.Peers.SetRenewal(func() (*cluster.Credentials, error) {
			creds, err := cc.issue(host)
			if err != nil {
				log.Error("cluster: renewing the node certificate with peer_ca_key_file", zap.Error(err))
				return nil, err
			}
			log.Info("cluster: node certificate renewed", zap.Time("not_after", creds.Cert.Leaf.NotAfter))
			return creds, nil
		})
	}
	e.Cluster.SetTargets(cc.previewServer(), cc.api)
	if cc.api == nil {
		e.Log.Warn("cluster: this config has no sandwake_api handler: API calls other nodes forward here answer 503")
	}
	if left := time.Until(cc.creds.Cert.Leaf.NotAfter); left < peer.CertRenewWarning && cc.PeerCAKeyFile == "" {
		e.Log.Warn("cluster: the node certificate expires soon: issue a new one (caddy sandwake cluster cert) and reload",
			zap.String("peer_cert_file", cc.PeerCertFile), zap.Time("not_after", cc.creds.Cert.Leaf.NotAfter))
	}
}

// registerPreview records the HTTP server a sandwake_preview route is
// provisioned in (the gate calls it): forwarded preview requests go
// through it as they would from a visitor. Nothing on a single host.
func (c *ClusterConfig) registerPreview(ctx caddy.Context) {
	if c == nil {
		return
	}
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil && !slices.Contains(c.previews, srv) {
		c.previews = append(c.previews, srv)
	}
}

// registerAPI records a sandwake_api handler of the config (the first):
// forwarded API calls are served by it. Nothing on a single host.
func (c *ClusterConfig) registerAPI(h http.Handler) {
	if c != nil && c.api == nil {
		c.api = h
	}
}

// previewServer is the server forwarded preview requests go through: of
// several with a sandwake_preview route, the one with the lowest listen
// addresses, so that every load picks the same.
func (c *ClusterConfig) previewServer() http.Handler {
	if len(c.previews) == 0 {
		return nil
	}
	srv := slices.MinFunc(c.previews, func(a, b *caddyhttp.Server) int {
		return strings.Compare(strings.Join(a.Listen, ","), strings.Join(b.Listen, ","))
	})
	return srv
}

// applyCapacity publishes the config's limits to what the node registers.
func (e *engine) applyCapacity(a *App) {
	e.MaxResident.Store(int64(*a.MaxResident))
	e.MinFreeBytes.Store(a.minFreeBytes)
	e.DefaultMemMB.Store(a.defaultMemMB)
}
