package caddymodule

import (
	"encoding/json"
	"testing"
)

// TestEngineOptions: engine docker is today's gateway, engine kubernetes
// takes its block into the app, and everything the kubernetes engine
// cannot honour is refused at provision naming the option, egress
// enforcement first (fails closed until `egress unenforced` is written).
func TestEngineOptions(t *testing.T) {
	const k8s = "engine kubernetes {\n\tkubeconfig /etc/k.conf\n\tnamespace sb\n\tstorage_class local-path\n\tvolume_size 2Gi\n}\n"
	const ok = k8s + "egress unenforced\n"
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
		{"kubernetes, no block", "engine kubernetes\negress unenforced", "", nil},
		{"kubernetes unknown option", "engine kubernetes {\n\tcontext x\n}", `unknown engine kubernetes option "context"`, nil},
		{"kubernetes option twice", "engine kubernetes {\n\tnamespace a\n\tnamespace b\n}", "namespace is given twice", nil},
		{"egress enforced", k8s, "write `egress unenforced`", nil},
		{"egress policy but not unenforced", k8s + "egress none", "write `egress unenforced`", nil},
		{"bad namespace", "engine kubernetes {\n\tnamespace Not_A_Name\n}\negress unenforced", "namespace", nil},
		{"bad volume size", "engine kubernetes {\n\tvolume_size lots\n}\negress unenforced", "volume_size", nil},
		{"instance not a label value", ok + "instance gw-", "label value", nil},
		{"egress_deny", ok + "egress_deny 10.0.0.0/8", "egress_deny", nil},
		{"egress_dns", ok + "egress_dns 1.1.1.1", "egress_dns", nil},
		{"docker_host", ok + "docker_host unix:///x.sock", "docker_host", nil},
		{"upstream_mode", ok + "upstream_mode published", "upstream_mode", nil},
		{"sandbox_network", ok + "sandbox_network sn", "sandbox_network", nil},
		{"label", ok + "label a b", "label", nil},
		{"nofile", ok + "nofile 1024", "nofile", nil},
		{"pull always", ok + "pull always", "pull always", nil},
		{"pull never", ok + "pull never", "", nil},
		{"allowed_registries", ok + "allowed_registries ghcr.io", "allowed_registries", nil},
		{"min_free_memory", ok + "min_free_memory 10%", "min_free_memory", nil},
		{"min_free_memory off", ok + "min_free_memory 0", "", nil},
		{"template with a pool", ok + "template web {\n\timage x\n\tports 80\n\tpool {\n\t\tmin_idle 1\n\t}\n}", "warm pools", nil},
		{"template without a pool", ok + "template web {\n\timage x\n\tports 80\n}", "", nil},
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
	} {
		if got := engineChanges(tt.running, tt.next) != ""; got != tt.changed {
			t.Errorf("engineChanges(%+v, %+v) changed = %v, want %v", tt.running, tt.next, got, tt.changed)
		}
	}
}
