package caddymodule

import (
	"encoding/json"
	"testing"

	core "github.com/sandwake/sandwake/engine"
)

// TestEngineOptions: engine docker is today's gateway, engine kubernetes
// takes its block into the app, and everything the kubernetes engine
// cannot honour is refused at provision naming the option (egress is a
// NetworkPolicy per sandbox: what needs names is refused).
func TestEngineOptions(t *testing.T) {
	const k8s = "engine kubernetes {\n\tkubeconfig /etc/k.conf\n\tnamespace sb\n\tstorage_class local-path\n\tvolume_size 2Gi\n}\n"
	const ok = k8s
	const netpol = "engine kubernetes {\n\tegress networkpolicy\n\tcluster_cidrs 10.244.0.0/16 198.18.0.0/15\n\tgateway_cidrs 10.88.0.1\n\tgateway_selector app=gw tier=edge\n}\n"
	tests := []struct {
		name    string
		input   string
		wantErr string
		check   func(t *testing.T, a *App)
	}{
		{"default docker", "", "", func(t *testing.T, a *App) {
			if kind, _ := a.Engine.options(); kind != "docker" || a.MinFreeMemory != DefaultMinFreeMemory {
				t.Fatalf("engine %s, min_free_memory %s", kind, a.MinFreeMemory)
			}
		}},
		{"docker named", "engine docker", "", func(t *testing.T, a *App) {
			if kind, _ := a.Engine.options(); kind != "docker" {
				t.Fatalf("engine %s", kind)
			}
		}},
		{"docker with a block", "engine docker {\n\tnamespace x\n}", "engine docker takes no block", nil},
		{"unknown engine", "engine podman", `engine "podman"`, nil},
		{"kubernetes", ok, "", func(t *testing.T, a *App) {
			kind, k := a.Engine.options()
			if kind != "kubernetes" || k.Kubeconfig != "/etc/k.conf" || k.Namespace != "sb" || k.StorageClass != "local-path" || k.VolumeSize != "2Gi" {
				t.Fatalf("engine %s %+v", kind, k)
			}
			if a.MinFreeMemory != "0" || a.minFreeBytes != 0 {
				t.Fatalf("min_free_memory %s: want off on kubernetes", a.MinFreeMemory)
			}
			b, _ := json.Marshal(a.Engine)
			if string(b) != `{"name":"kubernetes","kubeconfig":"/etc/k.conf","namespace":"sb","storage_class":"local-path","volume_size":"2Gi"}` {
				t.Fatalf("json %s", b)
			}
		}},
		{"kubernetes, no block", "engine kubernetes", "", nil},
		{"kubernetes, egress unenforced", "engine kubernetes\negress unenforced", "", nil},
		{"kubernetes egress options", netpol, "", func(t *testing.T, a *App) {
			_, k := a.Engine.options()
			if k.Egress != "networkpolicy" || len(k.ClusterCIDRs) != 2 || k.ClusterCIDRs[1].String() != "198.18.0.0/15" ||
				len(k.GatewayCIDRs) != 1 || k.GatewayCIDRs[0].String() != "10.88.0.1/32" || k.GatewaySelector["tier"] != "edge" || len(k.GatewaySelector) != 2 {
				t.Fatalf("egress options %+v", k)
			}
			b, _ := json.Marshal(a.Engine)
			if string(b) != `{"name":"kubernetes","egress":"networkpolicy","cluster_cidrs":["10.244.0.0/16","198.18.0.0/15"],"gateway_cidrs":["10.88.0.1"],"gateway_selector":{"app":"gw","tier":"edge"}}` {
				t.Fatalf("json %s", b)
			}
		}},
		{"egress networkpolicy and egress unenforced", netpol + "egress unenforced", "remove one of the two", nil},
		{"engine egress unenforced", "engine kubernetes {\n\tegress unenforced\n}", "in the sandwake block", nil},
		{"engine egress unknown", "engine kubernetes {\n\tegress cilium\n}", "want networkpolicy", nil},
		{"bad cluster_cidrs", "engine kubernetes {\n\tcluster_cidrs 10.0.0.0/33\n}", "cluster_cidrs", nil},
		{"IPv6 cluster_cidrs", "engine kubernetes {\n\tcluster_cidrs fd00::/8\n}", "IPv4", nil},
		{"bad gateway_selector", "engine kubernetes {\n\tgateway_selector app\n}", "key=value", nil},
		{"gateway_selector not a label", "engine kubernetes {\n\tgateway_selector app=a/b\n}", "label value", nil},
		{"egress learn", ok + "egress learn", "egress learn", nil},
		{"egress_allow with a name", ok + "egress none\negress_allow registry.npmjs.org 198.51.100.7:443", "egress_allow registry.npmjs.org", nil},
		{"egress_allow addresses", ok + "egress none\negress_allow 198.51.100.7:443", "", nil},
		{"kubernetes unknown option", "engine kubernetes {\n\tcontext x\n}", `unknown engine kubernetes option "context"`, nil},
		{"kubernetes option twice", "engine kubernetes {\n\tnamespace a\n\tnamespace b\n}", "namespace is given twice", nil},
		{"egress none enforced", k8s + "egress none", "", nil},
		{"bad namespace", "engine kubernetes {\n\tnamespace Not_A_Name\n}", "namespace", nil},
		{"bad volume size", "engine kubernetes {\n\tvolume_size lots\n}", "volume_size", nil},
		{"instance not a label value", ok + "instance gw-", "label value", nil},
		{"egress_deny", ok + "egress_deny 10.0.0.0/8", "egress_deny", nil},
		{"egress_dns", ok + "egress_dns 1.1.1.1", "egress_dns", nil},
		{"docker_host", ok + "docker_host unix:///x.sock", "docker_host", nil},
		{"upstream_mode", ok + "upstream_mode published", "upstream_mode", nil},
		{"sandbox_network", ok + "sandbox_network sn", "sandbox_network", nil},
		{"label", ok + "label team previews\nlabel example.com/cost-center c42", "", func(t *testing.T, a *App) {
			if a.Labels["team"] != "previews" || a.Labels["example.com/cost-center"] != "c42" {
				t.Fatalf("labels %v", a.Labels)
			}
		}},
		{"label not a Kubernetes label", ok + "label team a/b", `value "a/b" is not a Kubernetes label value`, nil},
		{"label of sandwake's own", ok + "label sandwake.id x", "sandwake's own", nil},
		{"nofile", ok + "nofile 1024", "nofile", nil},
		{"pull always", ok + "pull always", "pull always", nil},
		{"pull never", ok + "pull never", "", nil},
		{"allowed_registries", ok + "allowed_registries ghcr.io", "allowed_registries", nil},
		{"min_free_memory", ok + "min_free_memory 10%", "min_free_memory", nil},
		{"min_free_memory off", ok + "min_free_memory 0", "", nil},
		{"template with a pool", ok + "template web {\n\timage x\n\tports 80\n\tpool {\n\t\tmin_idle 1\n\t}\n}\npool_memory_max 1GiB", "", nil},
		{"placement", "engine kubernetes {\n\tnode_selector pool sandboxes\n\tnode_selector kubernetes.io/arch amd64\n\ttoleration sandbox=yes NoSchedule\n\ttoleration gpu\n\truntime_class gvisor\n}\negress unenforced", "", func(t *testing.T, a *App) {
			_, k := a.Engine.options()
			if len(k.NodeSelector) != 2 || k.NodeSelector["pool"] != "sandboxes" || k.RuntimeClass != "gvisor" || len(k.Tolerations) != 2 ||
				k.Tolerations[0] != (core.Toleration{Key: "sandbox", Value: "yes", Effect: "NoSchedule"}) || k.Tolerations[1] != (core.Toleration{Key: "gpu"}) {
				t.Fatalf("%+v", k)
			}
			b, _ := json.Marshal(a.Engine)
			if string(b) != `{"name":"kubernetes","node_selector":{"kubernetes.io/arch":"amd64","pool":"sandboxes"},"tolerations":[{"key":"sandbox","value":"yes","effect":"NoSchedule"},{"key":"gpu"}],"runtime_class":"gvisor"}` {
				t.Fatalf("json %s", b)
			}
		}},
		{"node_selector twice", "engine kubernetes {\n\tnode_selector a b\n\tnode_selector a c\n}\negress unenforced", "node_selector a is given twice", nil},
		{"bad node_selector", "engine kubernetes {\n\tnode_selector a b!\n}\negress unenforced", "node_selector", nil},
		{"bad toleration effect", "engine kubernetes {\n\ttoleration a=b Never\n}\negress unenforced", `effect "Never"`, nil},
		{"toleration value without key", "engine kubernetes {\n\ttoleration =b\n}\negress unenforced", "needs a key", nil},
		{"bad runtime_class", "engine kubernetes {\n\truntime_class Bad_Name\n}\negress unenforced", "runtime_class", nil},
		{"placement on docker", "engine docker\n", "", nil},
		{"template without a pool", ok + "template web {\n\timage x\n\tports 80\n}", "", nil},
		{"template egress by address", ok + "template web {\n\timage x\n\tports 80\n\tegress none 198.51.100.7:443\n}", "", nil},
		{"template egress by name", ok + "template web {\n\timage x\n\tports 80\n\tegress none registry.npmjs.org\n}", "is a name", nil},
		{"template egress deny by name", ok + "template web {\n\timage x\n\tports 80\n\tegress public\n\tegress_deny evil.example.com\n}", "is a name", nil},
		{"template egress learn", ok + "template web {\n\timage x\n\tports 80\n\tegress learn\n}", "egress learn", nil},
		{"template with a service", ok + "template web {\n\timage x\n\tports 80\n\tservice db {\n\t\timage pg\n\t}\n}", "", func(t *testing.T, a *App) {
			if len(a.Templates) != 1 || a.Templates[0].Services["db"].Image != "pg" {
				t.Fatalf("templates %+v", a.Templates)
			}
		}},
		{"docker settings on docker", "engine docker\nupstream_mode published\nlabel a b", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkOption(t, tt.input, tt.wantErr, tt.check) })
	}
}

// TestEngineChanges: a reload that changes the engine option is told apart
// from one that does not.
func TestEngineChanges(t *testing.T) {
	k := &EngineConfig{Name: "kubernetes", Namespace: "a"}
	for _, tt := range []struct {
		running EngineConfig
		next    *EngineConfig
		changed bool
	}{
		{EngineConfig{}, nil, false},
		{EngineConfig{}, &EngineConfig{Name: "docker"}, false},
		{EngineConfig{}, k, true},
		{*k, k, false},
		{*k, &EngineConfig{Name: "kubernetes", Namespace: "b"}, true},
		{*k, nil, true},
		{*k, &EngineConfig{Name: "kubernetes", Namespace: "a", RuntimeClass: "gvisor"}, true},
		{*k, &EngineConfig{Name: "kubernetes", Namespace: "a", NodeSelector: map[string]string{"a": "b"}}, true},
		{*k, &EngineConfig{Name: "kubernetes", Namespace: "a", Tolerations: []core.Toleration{{Key: "a"}}}, true},
		{*k, &EngineConfig{Name: "kubernetes", Namespace: "a", ClusterCIDRs: []string{"198.18.0.0/15"}}, true},
		{*k, &EngineConfig{Name: "kubernetes", Namespace: "a", GatewaySelector: map[string]string{"app": "gw"}}, true},
	} {
		if got := engineChanges(tt.running, tt.next) != ""; got != tt.changed {
			t.Errorf("engineChanges(%+v, %+v) changed = %v, want %v", tt.running, tt.next, got, tt.changed)
		}
	}
}
