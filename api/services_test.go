package api

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestServicesView: a sandbox's services show each member's state as the
// engine last showed it while the group runs, and the sandbox's own state
// otherwise; memory, image, ready and depends_on come from the spec, and
// the group's memory is the app's and its services'. A sandbox without
// services shows none, and no group memory.
func TestServicesView(t *testing.T) {
	spec := lifecycle.Spec{Image: "app", MemoryMB: 512, Services: map[string]lifecycle.Service{
		"db":    {Image: "postgres:17", MemoryMB: 256, Ready: "tcp:5432", Env: map[string]string{"POSTGRES_PASSWORD": "hunter2"}},
		"cache": {Image: "redis:7", MemoryMB: 64},
		"queue": {Image: "worker:1", MemoryMB: 128, DependsOn: []string{"cache", "db"}},
	}}
	for _, tc := range []struct {
		name   string
		state  lifecycle.State
		states map[string]lifecycle.ContainerState
		want   map[string]string
	}{
		{"running", lifecycle.Running, map[string]lifecycle.ContainerState{"db": lifecycle.ContainerRunning, "cache": lifecycle.ContainerExited, "queue": lifecycle.ContainerRunning},
			map[string]string{"db": "running", "cache": "exited", "queue": "running"}},
		{"running, a member not seen yet", lifecycle.Running, map[string]lifecycle.ContainerState{"db": lifecycle.ContainerRunning},
			map[string]string{"db": "running", "cache": "running", "queue": "running"}},
		{"paused", lifecycle.Paused, map[string]lifecycle.ContainerState{"db": lifecycle.ContainerRunning, "cache": lifecycle.ContainerRunning},
			map[string]string{"db": "paused", "cache": "paused", "queue": "paused"}},
		{"stopped", lifecycle.Stopped, nil, map[string]string{"db": "stopped", "cache": "stopped", "queue": "stopped"}},
		{"error", lifecycle.Error, map[string]lifecycle.ContainerState{"db": lifecycle.ContainerExited}, map[string]string{"db": "error", "cache": "error", "queue": "error"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := lifecycle.Record{ID: "abc", State: tc.state, Spec: spec, ServiceStates: tc.states}
			got, group := servicesView(&r, map[string]int64{"db": 3 << 20, "cache": 1 << 19})
			if group != 512+256+64+128 {
				t.Errorf("group memory %d, want %d", group, 512+256+64+128)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("services %+v, want %v", got, tc.want)
			}
			for name, state := range tc.want {
				if got[name].State != state {
					t.Errorf("%s: state %q, want %q", name, got[name].State, state)
				}
			}
			db := got["db"]
			if db.MemoryMB != 256 || db.Image != "postgres:17" || db.Ready != "tcp:5432" || db.DependsOn != nil {
				t.Errorf("db: %+v", db)
			}
			// The watchdog's measure shows while the group is resident.
			wantDisk := int64(0)
			if tc.state == lifecycle.Running || tc.state == lifecycle.Paused {
				wantDisk = 3
			}
			if db.DiskUsedMB != wantDisk || got["queue"].DiskUsedMB != 0 {
				t.Errorf("disk used: db %d MiB (want %d), queue %d (not measured)", db.DiskUsedMB, wantDisk, got["queue"].DiskUsedMB)
			}
			if q := got["queue"]; !reflect.DeepEqual(q.DependsOn, []string{"cache", "db"}) || q.Ready != "" {
				t.Errorf("queue: %+v", q)
			}
			b, _ := json.Marshal(client.Sandbox{Services: got, GroupMemoryMB: group})
			if strings.Contains(string(b), "hunter2") || strings.Contains(string(b), "POSTGRES_PASSWORD") {
				t.Errorf("the view shows a service's env: %s", b)
			}
		})
	}
	if got, group := servicesView(&lifecycle.Record{State: lifecycle.Running, Spec: lifecycle.Spec{Image: "app", MemoryMB: 512}}, nil); got != nil || group != 0 {
		t.Errorf("a sandbox without services: %+v, group memory %d", got, group)
	}
	b, _ := json.Marshal(client.Sandbox{ID: "abc"})
	if strings.Contains(string(b), `"services"`) || strings.Contains(string(b), `"group_memory_mb"`) {
		t.Errorf("a sandbox without services shows them: %s", b)
	}
}

// TestWireService: a create's services (client.Service) and the engine's
// (lifecycle.Service) are the same JSON, both ways, and serviceSpecs
// carries every field.
func TestWireService(t *testing.T) {
	c := client.Service{Image: "postgres:17", Cmd: []string{"postgres", "-c", "fsync=off"}, Env: map[string]string{"A": "1"}, MemoryMB: 256, CPUs: 0.5,
		DiskMB: 500, Ready: "http:8080/healthz", WorkspacePath: "/var/lib/postgresql", DependsOn: []string{"cache"}}
	fromClient, _ := json.Marshal(c)
	var l lifecycle.Service
	if err := json.Unmarshal(fromClient, &l); err != nil {
		t.Fatal(err)
	}
	if back, _ := json.Marshal(l); string(back) != string(fromClient) {
		t.Fatalf("lifecycle.Service writes %s, client.Service %s", back, fromClient)
	}
	if got := serviceSpecs(map[string]client.Service{"db": c})["db"]; !reflect.DeepEqual(got, l) {
		t.Fatalf("serviceSpecs: %+v, want %+v", got, l)
	}
	ct, lt := reflect.TypeFor[client.Service](), reflect.TypeFor[lifecycle.Service]()
	if !reflect.DeepEqual(jsonFields(ct), jsonFields(lt)) {
		t.Fatalf("client.Service has fields %v, lifecycle.Service %v", jsonFields(ct), jsonFields(lt))
	}
	if serviceSpecs(nil) != nil {
		t.Fatal("no services became some")
	}
	spec, err := Spec(client.CreateRequest{Image: "app", Ports: []int{80}, Services: map[string]client.Service{"db": c}})
	if err != nil || !reflect.DeepEqual(spec.Services["db"], l) {
		t.Fatalf("Spec: %+v %v", spec.Services, err)
	}
}

// TestPlacementMemory: in a cluster a create is placed by its whole group's
// memory: the app's and each service's, each the create's own, else its
// template's, else the gateway's default.
func TestPlacementMemory(t *testing.T) {
	svc := func(mb int64) lifecycle.Service { return lifecycle.Service{Image: "x", MemoryMB: mb} }
	tmpl := &lifecycle.Spec{MemoryMB: 512, Services: map[string]lifecycle.Service{"db": svc(256)}}
	for _, tc := range []struct {
		name string
		spec lifecycle.Spec
		tmpl *lifecycle.Spec
		want int64
	}{
		{"a single container", lifecycle.Spec{MemoryMB: 300}, nil, 300},
		{"the default", lifecycle.Spec{}, nil, 128},
		{"a group", lifecycle.Spec{MemoryMB: 300, Services: map[string]lifecycle.Service{"db": svc(256), "cache": svc(64)}}, nil, 620},
		{"a service on the default", lifecycle.Spec{MemoryMB: 300, Services: map[string]lifecycle.Service{"db": svc(0)}}, nil, 428},
		{"a template's group", lifecycle.Spec{}, tmpl, 768},
		{"an empty services map beside a template", lifecycle.Spec{Services: map[string]lifecycle.Service{}}, tmpl, 768},
		{"the create's memory over the template's", lifecycle.Spec{MemoryMB: 100}, tmpl, 356},
	} {
		if got := placementMemoryMB(&tc.spec, tc.tmpl, 128); got != tc.want {
			t.Errorf("%s: %d MB, want %d", tc.name, got, tc.want)
		}
	}
}
