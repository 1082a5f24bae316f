package caddymodule

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestClusterOptions: the cluster block is parsed, defaulted and validated,
// with errors naming the option; the node name is the instance name.
func TestClusterOptions(t *testing.T) {
	const full = `cluster {
	etcd http://10.0.0.5:2379 http://10.0.0.6:2379
	node node-a
	advertise 10.0.0.11:80
	advertise_api 10.0.0.11:8081
	secret 0123456789abcdef
	prefix /sw/
	lease_ttl 2s
}`
	block := func(lines ...string) string {
		return "cluster {\n" + strings.Join(lines, "\n") + "\n}"
	}
	required := []string{"etcd http://127.0.0.1:2379", "node n1", "advertise 127.0.0.1:80", "advertise_api 127.0.0.1:81", "secret 0123456789abcdef"}
	without := func(opt string) string {
		var keep []string
		for _, l := range required {
			if !strings.HasPrefix(l, opt+" ") {
				keep = append(keep, l)
			}
		}
		return block(keep...)
	}
	host, _ := os.Hostname()
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
			want := []string{"http://10.0.0.5:2379", "http://10.0.0.6:2379"}
			if !reflect.DeepEqual(c.Etcd, want) || c.Node != "node-a" || c.Advertise != "10.0.0.11:80" || c.AdvertiseAPI != "10.0.0.11:8081" ||
				string(c.secret) != "0123456789abcdef" || c.Prefix != "/sw/" || time.Duration(c.LeaseTTL) != 2*time.Second {
				t.Fatalf("got %+v", c)
			}
			if a.Instance != "node-a" {
				t.Fatalf("instance %q, want the node name", a.Instance)
			}
			// The block survives the JSON round trip of parseGlobalOption.
			b, err := json.Marshal(a)
			if err != nil || !strings.Contains(string(b), `"advertise_api":"10.0.0.11:8081"`) {
				t.Fatalf("json %s %v", b, err)
			}
		}},
		{"defaults", block(required[0], required[2], required[3], required[4]), "", func(t *testing.T, a *App) {
			c := a.Cluster
			if c.Node != strings.ToLower(host) || c.Prefix != "/sandwake/" || time.Duration(c.LeaseTTL) != 10*time.Second || a.Instance != c.Node {
				t.Fatalf("defaults: node %q (host %q) prefix %q ttl %v instance %q", c.Node, host, c.Prefix, c.LeaseTTL, a.Instance)
			}
		}},
		{"instance equal to node", "instance n1\n" + block(required...), "", nil},
		{"instance differs", "instance other\n" + block(required...), `instance "other" and cluster node "n1" differ`, nil},
		{"no etcd", without("etcd"), "etcd", nil},
		{"no advertise", without("advertise"), "advertise is required", nil},
		{"no advertise_api", without("advertise_api"), "advertise_api is required", nil},
		{"no secret", without("secret"), "secret is required", nil},
		{"short secret", block(append(required[:4:4], "secret short")...), "at least 16 bytes", nil},
		{"secret placeholder unset", block(append(required[:4:4], "secret {env.SANDWAKE_TEST_UNSET_SECRET}")...), "at least 16 bytes", nil},
		{"etcd not a url", block(append([]string{"etcd 127.0.0.1:2379"}, required[1:]...)...), "not an http(s) URL", nil},
		{"advertise without port", block(required[0], required[1], "advertise 127.0.0.1", required[3], required[4]), "advertise \"127.0.0.1\" is not host:port", nil},
		{"bad node", block(append([]string{"node Node_A"}, required[0], required[2], required[3], required[4])...), "node", nil},
		{"unknown option", block(append(required, "peers 3")...), "unknown cluster option", nil},
		{"option twice", block(append(required, "node n2")...), "given twice", nil},
		{"bad ttl", block(append(required, "lease_ttl soon")...), "lease_ttl", nil},
		{"argument on block", "cluster x {\n}", "wrong argument", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkOption(t, tt.input, tt.wantErr, tt.check) })
	}
}
