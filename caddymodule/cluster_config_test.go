package caddymodule

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandwake/sandwake/cluster/clustertest"
)

// TestClusterOptions: the cluster block is parsed, defaulted and validated,
// with errors naming the option; the node name is the instance name; the
// node certificate must be the node's, of the CA given, and cover the
// advertised host.
func TestClusterOptions(t *testing.T) {
	host, _ := os.Hostname()
	dir := t.TempDir()
	pki := clustertest.NewPKI(t)
	n1 := pki.WriteNode(t, dir, "n1", "127.0.0.1")
	nodeA := pki.WriteNode(t, dir, "node-a", "10.0.0.11")
	n2 := pki.WriteNode(t, dir, "n2", "127.0.0.1")
	self := pki.WriteNode(t, dir, strings.ToLower(host), "127.0.0.1")
	strangerDir := t.TempDir()
	stranger := clustertest.NewPKI(t).WriteNode(t, strangerDir, "n1", "127.0.0.1")
	peerFiles := func(f clustertest.Files) []string {
		return []string{"peer_ca_file " + f.CA, "peer_cert_file " + f.Cert, "peer_key_file " + f.Key}
	}
	full := `cluster {
	etcd https://10.0.0.5:2379 https://10.0.0.6:2379
	node node-a
	peer_listen 10.0.0.11:7443
	` + strings.Join(peerFiles(nodeA), "\n\t") + `
	secret 0123456789abcdef
	prefix /sw/
	lease_ttl 2s
}`
	block := func(lines ...string) string {
		return "cluster {\n" + strings.Join(lines, "\n") + "\n}"
	}
	required := append([]string{"etcd https://127.0.0.1:2379", "node n1", "peer_listen 127.0.0.1:7443", "secret 0123456789abcdef"}, peerFiles(n1)...)
	// with is required with each line of over replacing the one of its
	// option ("-option" removes it), and the others added.
	with := func(over ...string) string {
		lines := slices.Clone(required)
		for _, o := range over {
			opt, _, _ := strings.Cut(strings.TrimPrefix(o, "-"), " ")
			i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, opt+" ") })
			switch {
			case strings.HasPrefix(o, "-"):
				lines = slices.Delete(lines, i, i+1)
			case i >= 0:
				lines[i] = o
			default:
				lines = append(lines, o)
			}
		}
		return block(lines...)
	}
	secretFile := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	password := secretFile("password", "node-pw\r\nignored\n", 0o600)
	worldPassword := secretFile("world-password", "node-pw\n", 0o644)
	emptyPassword := secretFile("empty-password", "\n", 0o600)
	worldKey := secretFile("world.key", "not a key", 0o644)
	worldPeerKey := secretFile("world-n1.key", "", 0o644)
	if b, err := os.ReadFile(n1.Key); err != nil || os.WriteFile(worldPeerKey, b, 0o644) != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(worldPeerKey, 0o644); err != nil {
		t.Fatal(err)
	}
	// Backend kubernetes: a kubeconfig (nothing is contacted at load), the
	// CA's key to issue the node's certificate with.
	kubeconfig := secretFile("kubeconfig", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, 0o600)
	caFile := secretFile("ca.crt", string(pki.CACert), 0o644)
	caKey := secretFile("ca.key", string(pki.CAKey), 0o600)
	worldCAKey := secretFile("world-ca.key", string(pki.CAKey), 0o644)
	kube := func(lines ...string) string {
		return block(append([]string{"backend kubernetes", "kubeconfig " + kubeconfig, "namespace previews", "node sandwake-1",
			"peer_listen :7443", "advertise 10.244.0.7:7443", "peer_ca_file " + caFile, "peer_ca_key_file " + caKey,
			"secret 0123456789abcdef"}, lines...)...)
	}
	tests := []struct {
		name    string
		input   string
		wantErr string
		check   func(t *testing.T, a *App)
	}{
		{"none", "", "", func(t *testing.T, a *App) {
			if a.Cluster != nil {
				t.Fatalf("cluster %+v without a block", a.Cluster)
			}
		}},
		{"full", full, "", func(t *testing.T, a *App) {
			c := a.Cluster
			want := []string{"https://10.0.0.5:2379", "https://10.0.0.6:2379"}
			if !reflect.DeepEqual(c.Etcd, want) || c.Node != "node-a" || c.PeerListen != "10.0.0.11:7443" || c.Advertise != "10.0.0.11:7443" ||
				string(c.secret) != "0123456789abcdef" || c.Prefix != "/sw/" || time.Duration(c.LeaseTTL) != 2*time.Second ||
				c.creds == nil || c.creds.Node != "node-a" {
				t.Fatalf("got %+v", c)
			}
			if a.Instance != "node-a" {
				t.Fatalf("instance %q, want the node name", a.Instance)
			}
			// The block survives the JSON round trip of parseGlobalOption.
			b, err := json.Marshal(a)
			if err != nil || !strings.Contains(string(b), `"peer_listen":"10.0.0.11:7443"`) || !strings.Contains(string(b), `"peer_cert_file":"`+nodeA.Cert+`"`) {
				t.Fatalf("json %s %v", b, err)
			}
		}},
		{"defaults", with("-node", "peer_cert_file "+self.Cert, "peer_key_file "+self.Key), "", func(t *testing.T, a *App) {
			c := a.Cluster
			if c.Node != strings.ToLower(host) || c.Prefix != "/sandwake/" || time.Duration(c.LeaseTTL) != 10*time.Second || a.Instance != c.Node ||
				c.Advertise != "127.0.0.1:7443" {
				t.Fatalf("defaults: node %q (host %q) prefix %q ttl %v instance %q advertise %q", c.Node, host, c.Prefix, c.LeaseTTL, a.Instance, c.Advertise)
			}
		}},
		{"instance equal to node", "instance n1\n" + with(), "", nil},
		{"instance differs", "instance other\n" + with(), `instance "other" and cluster node "n1" differ`, nil},
		{"no etcd", with("-etcd"), "etcd", nil},
		{"plaintext etcd refused", with("etcd http://127.0.0.1:2379"), "insecure_plaintext", nil},
		{"plaintext etcd with insecure_plaintext", with("etcd http://127.0.0.1:2379", "insecure_plaintext"), "", func(t *testing.T, a *App) {
			if !a.Cluster.InsecurePlaintext || a.Cluster.tls != nil {
				t.Fatalf("insecure_plaintext %v tls %v", a.Cluster.InsecurePlaintext, a.Cluster.tls)
			}
		}},
		{"mixed schemes", with("etcd https://127.0.0.1:2379 http://127.0.0.1:2380"), "mix http:// and https://", nil},
		{"insecure_plaintext with https", with("insecure_plaintext"), "remove it", nil},
		{"cert without key", with("etcd_cert_file /nonexistent.crt"), "go together", nil},
		{"user without password", with("etcd_username sandwake"), "go together", nil},
		{"password file", with("etcd_username sandwake", "etcd_password_file "+password), "", func(t *testing.T, a *App) {
			if a.Cluster.password != "node-pw" {
				t.Fatalf("password %q, want the file's first line without its line end", a.Cluster.password)
			}
		}},
		{"world-readable password file", with("etcd_username sandwake", "etcd_password_file "+worldPassword), "readable by every user", nil},
		{"empty password file", with("etcd_username sandwake", "etcd_password_file "+emptyPassword), "is empty", nil},
		{"unreadable password file", with("etcd_username sandwake", "etcd_password_file "+filepath.Join(dir, "none")), "etcd_password_file", nil},
		{"world-readable key file", with("etcd_cert_file "+worldKey, "etcd_key_file "+worldKey), "etcd_key_file " + worldKey + " is readable by every user", nil},
		{"missing ca file", with("etcd_ca_file /nonexistent-ca.crt"), "etcd_ca_file", nil},
		{"no peer_listen", with("-peer_listen"), "peer_listen is required", nil},
		{"peer_listen on every address", with("peer_listen :7443"), "advertise is required when peer_listen :7443 binds every address", nil},
		{"peer_listen on 0.0.0.0", with("peer_listen 0.0.0.0:7443"), "advertise is required", nil},
		{"peer_listen on every address, advertised", with("peer_listen :7443", "advertise 127.0.0.1:17443"), "", func(t *testing.T, a *App) {
			if a.Cluster.Advertise != "127.0.0.1:17443" {
				t.Fatalf("advertise %q", a.Cluster.Advertise)
			}
		}},
		{"advertise without port", with("advertise 127.0.0.1"), "advertise \"127.0.0.1\" is not host:port", nil},
		{"advertise not covered", with("advertise 10.0.0.99:7443"), "does not cover the advertised host 10.0.0.99", nil},
		{"no peer certificate", with("-peer_cert_file"), "peer_ca_file, peer_cert_file and peer_key_file are required", nil},
		{"another node's certificate", with("peer_cert_file "+n2.Cert, "peer_key_file "+n2.Key), "is node n2's certificate, but this node is n1", nil},
		{"certificate of another CA", with("peer_cert_file "+stranger.Cert, "peer_key_file "+stranger.Key), "peer_cert_file", nil},
		{"world-readable peer key", with("peer_key_file " + worldPeerKey), "peer_key_file " + worldPeerKey + " is readable by every user", nil},
		{"advertise_api is gone", with("advertise_api 127.0.0.1:81"), "advertise_api is gone", nil},
		{"no secret", with("-secret"), "secret is required", nil},
		{"short secret", with("secret short"), "at least 16 bytes", nil},
		{"secret placeholder unset", with("secret {env.SANDWAKE_TEST_UNSET_SECRET}"), "at least 16 bytes", nil},
		{"etcd not a url", with("etcd 127.0.0.1:2379"), "not an http(s) URL", nil},
		{"bad node", with("node Node_A"), "node", nil},
		{"unknown option", with("peers 3"), "unknown cluster option", nil},
		{"option twice", block(append(required, "node n2")...), "given twice", nil},
		{"bad ttl", with("lease_ttl soon"), "lease_ttl", nil},
		{"argument on block", "cluster x {\n}", "wrong argument", nil},
		{"backend kubernetes", kube(), "", func(t *testing.T, a *App) {
			c := a.Cluster
			if c.Backend != "kubernetes" || c.kube == nil || c.kube.Namespace != "previews" || c.kube.Server != "https://127.0.0.1:1" || a.Instance != "sandwake-1" {
				t.Fatalf("backend %q kube %+v instance %q", c.Backend, c.kube, a.Instance)
			}
			// The node's certificate, issued at load: its name, its
			// advertised address, the CA given.
			if c.creds == nil || c.creds.Node != "sandwake-1" || c.creds.Cert.Leaf.VerifyHostname("10.244.0.7") != nil {
				t.Fatalf("issued credentials %+v", c.creds)
			}
		}},
		{"backend kubernetes, namespace from engine kubernetes", "engine kubernetes {\n namespace sandboxes\n kubeconfig " + kubeconfig + "\n}\n" +
			block("backend kubernetes", "node sandwake-1", "peer_listen :7443", "advertise 10.244.0.7:7443", "peer_ca_file "+caFile, "peer_ca_key_file "+caKey, "secret 0123456789abcdef"),
			"", func(t *testing.T, a *App) {
				if a.Cluster.kube == nil || a.Cluster.kube.Namespace != "sandboxes" || a.Cluster.Kubeconfig != kubeconfig {
					t.Fatalf("kube %+v kubeconfig %q, want the engine's", a.Cluster.kube, a.Cluster.Kubeconfig)
				}
			}},
		{"backend unknown", kube("backend consul"), "given twice", nil},
		{"backend unknown alone", block("backend consul"), `backend "consul": want etcd or kubernetes`, nil},
		{"etcd with backend kubernetes", kube("etcd https://127.0.0.1:2379"), "settings of backend etcd, not kubernetes", nil},
		{"namespace with backend etcd", with("namespace previews"), "kubeconfig and namespace are settings of backend kubernetes", nil},
		{"peer_ca_key_file with peer_cert_file", with("peer_ca_key_file " + caKey), "give it instead of peer_cert_file and peer_key_file", nil},
		{"world-readable CA key", block("backend kubernetes", "kubeconfig "+kubeconfig, "namespace previews", "node sandwake-1", "peer_listen :7443",
			"advertise 10.244.0.7:7443", "peer_ca_file "+caFile, "peer_ca_key_file "+worldCAKey, "secret 0123456789abcdef"), "peer_ca_key_file " + worldCAKey + " is readable by every user", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkOption(t, tt.input, tt.wantErr, tt.check) })
	}
}
