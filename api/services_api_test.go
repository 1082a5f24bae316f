package api_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	swclient "github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/gateway"

	"github.com/sandwake/sandwake/internal/testenv"
)

// TestServicesAPIRefusals: through a real gateway, a create whose services
// are wrong is a 400 naming the service and the field (the lifecycle's
// words), before any container is made; a create from a template may not
// set services beside it.
func TestServicesAPIRefusals(t *testing.T) {
	h := newHarness(t, fmt.Sprintf("template web {\n\t\t\timage %s\n\t\t\tports 8080\n\t\t}", testenv.TestAppImage(t)))
	for _, tc := range []struct {
		name     string
		services map[string]any
		extra    map[string]any
		want     []string
	}{
		{"a bad ready", map[string]any{"db": map[string]any{"image": h.Image, "ready": "udp:5432"}}, nil,
			[]string{"services.db.ready", "tcp:<port> or http:<port>"}},
		{"a ready port out of range", map[string]any{"db": map[string]any{"image": h.Image, "ready": "tcp:70000"}}, nil,
			[]string{"services.db.ready", "70000"}},
		{"a tcp ready with a path", map[string]any{"db": map[string]any{"image": h.Image, "ready": "tcp:5432/x"}}, nil,
			[]string{"services.db.ready", "no path"}},
		{"an unknown depends_on", map[string]any{"db": map[string]any{"image": h.Image, "depends_on": []string{"cache"}}}, nil,
			[]string{"services", "db", `"cache"`, "not one of its services"}},
		{"a cycle", map[string]any{
			"a": map[string]any{"image": h.Image, "depends_on": []string{"b"}},
			"b": map[string]any{"image": h.Image, "depends_on": []string{"a"}},
		}, nil, []string{"services", "cycle", "a → b → a"}},
		{"the reserved name net", map[string]any{"net": map[string]any{"image": h.Image}}, nil, []string{"services", `"net"`, "not a service name"}},
		{"the reserved name app", map[string]any{"app": map[string]any{"image": h.Image}}, nil, []string{"services", `"app"`, "not a service name"}},
		{"a name with capitals", map[string]any{"DB": map[string]any{"image": h.Image}}, nil, []string{"services", `"DB"`, "not a service name"}},
		{"no image", map[string]any{"db": map[string]any{"ready": "tcp:5432"}}, nil, []string{"services.db.image", "required"}},
		{"too little memory", map[string]any{"db": map[string]any{"image": h.Image, "memory_mb": 1}}, nil, []string{"services.db.memory_mb", "outside"}},
		{"a relative workspace", map[string]any{"db": map[string]any{"image": h.Image, "workspace_path": "data"}}, nil, []string{"services.db.workspace_path", "absolute"}},
		{"negative disk", map[string]any{"db": map[string]any{"image": h.Image, "disk_mb": -1}}, nil, []string{"services.db.disk_mb", "negative"}},
		{"an unknown field", map[string]any{"db": map[string]any{"image": h.Image, "port": 5432}}, nil, []string{`services.db: unknown field "port"`, "ready"}},
		{"a memory as a string", map[string]any{"db": map[string]any{"image": h.Image, "memory_mb": "256"}}, nil, []string{"services.memory_mb: expected a whole number, got a string"}},
		{"beside a template", map[string]any{"db": map[string]any{"image": h.Image}}, map[string]any{"template": "web", "image": nil, "ports": nil},
			[]string{"services", "bypass"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			extra := map[string]any{"services": tc.services}
			for k, v := range tc.extra {
				extra[k] = v
			}
			var e swclient.ErrorResponse
			status, _ := h.createRaw(extra, &e)
			if status != http.StatusBadRequest || e.Error.Code != "invalid" {
				t.Fatalf("create: %d %+v, want 400 invalid", status, e)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Error.Message, w) {
					t.Errorf("message %q lacks %q", e.Error.Message, w)
				}
			}
		})
	}
	if ids := h.listIDs(""); len(ids) != 0 {
		t.Fatalf("refused creates left sandboxes: %v", ids)
	}
}

// createRaw posts a create of the test app on port 8080 with the given
// fields on top (a nil value removes a field) and decodes the answer into
// out; it registers the sandbox's removal through the API first.
func (h *harness) createRaw(extra map[string]any, out any) (int, string) {
	h.T.Helper()
	id := testenv.UniqueID("s")
	h.T.Cleanup(func() { h.destroyAndPurge(id) })
	body := map[string]any{"id": id, "image": h.Image, "ports": []int{8080}}
	for k, v := range extra {
		if v == nil {
			delete(body, k)
			continue
		}
		body[k] = v
	}
	return h.API("POST", "/v1/sandboxes", body, out), id
}

// destroyAndPurge removes sandbox id, its group and its volumes through
// the API (what the lifecycle knows of it), if it exists.
func (h *harness) destroyAndPurge(id string) {
	testenv.Eventually(h.T, 60*time.Second, func() (bool, string) {
		status := h.API("DELETE", "/v1/sandboxes/"+id, nil, nil)
		return status == http.StatusNoContent || status == http.StatusNotFound, fmt.Sprintf("destroy %s: %d", id, status)
	})
	h.API("POST", "/v1/sandboxes/"+id+"/purge", nil, nil)
}

// TestServicesAPIRoundTrip: on the real engine, a create with a service
// answers the record with the service (its state, memory, image, ready
// and depends_on) and the group's memory; the app reaches the service on
// localhost; what the service writes shows as its disk_used_mb; the
// services gauge counts the group's services while it runs; a stopped
// group shows its members stopped, and the gauge drops them.
func TestServicesAPIRoundTrip(t *testing.T) {
	h := newHarness(t, "disk_check_interval 200ms")
	var rec swclient.Sandbox
	status, id := h.createRaw(map[string]any{"memory_mb": 64, "services": map[string]any{
		"db":     map[string]any{"image": h.Image, "env": map[string]string{"PORT": "5432", "LISTEN_HOST": "127.0.0.1"}, "ready": "http:5432/healthz", "memory_mb": 96},
		"worker": map[string]any{"image": h.Image, "env": map[string]string{"PORT": "7000"}, "depends_on": []string{"db"}},
	}}, &rec)
	if status != http.StatusCreated {
		t.Fatalf("create with services: %d %+v", status, rec)
	}
	check := func(what string, rec swclient.Sandbox, state string) {
		t.Helper()
		db, worker := rec.Services["db"], rec.Services["worker"]
		if len(rec.Services) != 2 || db.State != state || db.MemoryMB != 96 || db.Image != h.Image || db.Ready != "http:5432/healthz" ||
			worker.State != state || worker.MemoryMB <= 0 || len(worker.DependsOn) != 1 || worker.DependsOn[0] != "db" {
			t.Fatalf("%s: services %+v, want both %s", what, rec.Services, state)
		}
		if rec.MemoryMB != 64 || rec.GroupMemoryMB != 64+96+worker.MemoryMB {
			t.Fatalf("%s: memory_mb %d, group_memory_mb %d, want 64 and %d", what, rec.MemoryMB, rec.GroupMemoryMB, 64+96+worker.MemoryMB)
		}
	}
	check("create", rec, "running")
	var got swclient.Sandbox
	h.API("GET", "/v1/sandboxes/"+id, nil, &got)
	check("get", got, "running")
	resp, body := h.Preview("GET", h.Host(id, 8080), "/fetch?url=http://localhost:5432/healthz", nil, nil)
	if resp.StatusCode != 200 || body != "ok 200 ok\n" {
		t.Fatalf("the app fetching its service on localhost: %d %q", resp.StatusCode, body)
	}
	// The app has its service write 3 MiB into the service's workspace.
	fill := url.QueryEscape("http://localhost:5432/fill?path=/workspace/big&mb=3")
	if resp, body := h.Preview("GET", h.Host(id, 8080), "/fetch?url="+fill, nil, nil); resp.StatusCode != 200 || !strings.HasPrefix(body, "ok 200") {
		t.Fatalf("the service writing 3 MiB: %d %q", resp.StatusCode, body)
	}
	testenv.Eventually(t, 15*time.Second, func() (bool, string) {
		h.API("GET", "/v1/sandboxes/"+id, nil, &got)
		return got.Services["db"].DiskUsedMB >= 3 && got.DiskUsedMB != nil && *got.DiskUsedMB >= 3,
			fmt.Sprintf("db disk_used_mb %d, the sandbox's %v", got.Services["db"].DiskUsedMB, got.DiskUsedMB)
	})
	if n := servicesGauge(t, "running"); n != 2 {
		t.Fatalf("caddy_sandwake_services{state=running} = %v with one group of two services running, want 2", n)
	}
	h.Stop(id)
	h.API("GET", "/v1/sandboxes/"+id, nil, &got)
	check("stopped", got, "stopped")
	if got.Services["db"].DiskUsedMB != 0 {
		t.Errorf("a stopped group shows its service's disk_used_mb %d", got.Services["db"].DiskUsedMB)
	}
	if n := servicesGauge(t, "running"); n != 0 {
		t.Fatalf("caddy_sandwake_services{state=running} = %v after the group stopped, want 0", n)
	}
}

// servicesGauge reads caddy_sandwake_services{state} from the gateway's
// collectors.
func servicesGauge(t *testing.T, state string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(gateway.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "caddy_sandwake_services" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" && l.GetValue() == state {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no caddy_sandwake_services{state=%q} among the gateway's metrics", state)
	return 0
}
