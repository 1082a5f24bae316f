package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	swclient "github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestParseService: --service takes NAME=IMAGE and the API's keys (or
// their kebab-case), env as env.KEY=VALUE, cmd split on spaces and
// depends_on joined with +; a bad value is an error naming the service
// and the key.
func TestParseService(t *testing.T) {
	for _, tc := range []struct {
		value, name string
		want        swclient.Service
		err         string
	}{
		{value: "db=postgres:17", name: "db", want: swclient.Service{Image: "postgres:17"}},
		{value: "db=postgres:17,ready=tcp:5432,memory_mb=256,cpus=0.5,disk_mb=500,workspace_path=/var/lib/postgresql,depends_on=cache+queue,cmd=postgres -c fsync=off,env.POSTGRES_PASSWORD=dev,env.PGDATA=/var/lib/postgresql/data",
			name: "db", want: swclient.Service{Image: "postgres:17", Ready: "tcp:5432", MemoryMB: 256, CPUs: 0.5, DiskMB: 500, WorkspacePath: "/var/lib/postgresql",
				DependsOn: []string{"cache", "queue"}, Cmd: []string{"postgres", "-c", "fsync=off"}, Env: map[string]string{"POSTGRES_PASSWORD": "dev", "PGDATA": "/var/lib/postgresql/data"}}},
		{value: "web=registry.example.com:5000/app@sha256:abc,memory-mb=64,ready=http:8080/healthz,env.EMPTY=", name: "web",
			want: swclient.Service{Image: "registry.example.com:5000/app@sha256:abc", MemoryMB: 64, Ready: "http:8080/healthz", Env: map[string]string{"EMPTY": ""}}},
		{value: "db", err: `--service "db": want NAME=IMAGE`},
		{value: "=postgres", err: `--service "=postgres": want NAME=IMAGE`},
		{value: "db=", err: `--service "db=": want NAME=IMAGE`},
		{value: "db=pg,port=5432", err: `--service db: unknown key "port" (keys: ready, memory_mb, cpus, disk_mb, workspace_path, depends_on, cmd, env.KEY)`},
		{value: "db=pg,ready", err: `--service db: "ready" is not key=value`},
		{value: "db=pg,,ready=tcp:1", err: `--service db: "" is not key=value`},
		{value: "db=pg,memory_mb=lots", err: `--service db: memory_mb "lots" is not a whole number of MiB`},
		{value: "db=pg,disk-mb=1.5", err: `--service db: disk-mb "1.5" is not a whole number of MiB`},
		{value: "db=pg,cpus=half", err: `--service db: cpus "half" is not a number of cores`},
		{value: "db=pg,depends_on=cache++queue", err: `--service db: depends_on "cache++queue": want names joined with +`},
		{value: "db=pg,cmd= ", err: `--service db: cmd is empty`},
		{value: "db=pg,env.=x", err: `--service db: "env.=x": env.KEY=VALUE needs a KEY`},
		{value: "db=pg,env.A=1,env.A=2", err: `--service db: env.A given twice`},
		{value: "db=pg,ready=tcp:1,ready=tcp:2", err: `--service db: ready given twice`},
		{value: "db=pg,memory_mb=1,memory-mb=2", err: `--service db: memory-mb given twice`},
	} {
		t.Run(tc.value, func(t *testing.T) {
			name, got, err := parseService(tc.value)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if name != tc.name || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parsed %q %+v, want %q %+v", name, got, tc.name, tc.want)
			}
		})
	}
	if _, err := parseServices([]string{"db=a", "db=b"}); err == nil || err.Error() != "--service db: given twice" {
		t.Fatalf("a service given twice: %v", err)
	}
	got, err := parseServices([]string{"db=a,ready=tcp:5432", "cache=b"})
	if err != nil || len(got) != 2 || got["db"].Ready != "tcp:5432" || got["cache"].Image != "b" {
		t.Fatalf("two services: %+v %v", got, err)
	}
	if got, err := parseServices(nil); got != nil || err != nil {
		t.Fatalf("no --service: %+v %v", got, err)
	}
}

// TestWriteRecordServices: `get` prints the group's memory and a line per
// service, by name: its state, memory, image, ready probe and what it
// starts after.
func TestWriteRecordServices(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	r := swclient.Sandbox{ID: "abc", State: "running", Image: "app:1", MemoryMB: 512, GroupMemoryMB: 832, Services: map[string]swclient.ServiceView{
		"db":    {State: "running", MemoryMB: 256, Image: "postgres:17", Ready: "tcp:5432"},
		"cache": {State: "exited", MemoryMB: 64, Image: "redis:7"},
		"queue": {State: "running", Image: "worker:1", Ready: "http:9000/healthz", DependsOn: []string{"cache", "db"}, DiskUsedMB: 12},
	}}
	var b bytes.Buffer
	if err := writeRecord(&b, &r, now); err != nil {
		t.Fatal(err)
	}
	kv := parseRecordLines(b.String())
	for k, want := range map[string]string{
		"memory":        "512 MiB",
		"group memory":  "832 MiB (app and services)",
		"service cache": "exited, 64 MiB, redis:7",
		"service db":    "running, 256 MiB, postgres:17, ready tcp:5432",
		"service queue": "running, 12 MiB written, worker:1, ready http:9000/healthz, after cache+db",
	} {
		if kv[k] != want {
			t.Errorf("%s: %q, want %q\n%s", k, kv[k], want, b.String())
		}
	}
	if i, j := strings.Index(b.String(), "service cache"), strings.Index(b.String(), "service db"); i < 0 || j < i {
		t.Errorf("services not by name:\n%s", b.String())
	}
	b.Reset()
	r.Services, r.GroupMemoryMB = nil, 0
	if err := writeRecord(&b, &r, now); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "service") || strings.Contains(b.String(), "group memory") {
		t.Errorf("a sandbox without services prints them:\n%s", b.String())
	}
}

// TestWriteRecordPublicCard: get says when a private sandbox's link card
// is open to unfurl bots, and says nothing of cards otherwise.
func TestWriteRecordPublicCard(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		r    swclient.Sandbox
		want string
	}{
		{swclient.Sandbox{ID: "abc", State: "running", Access: "private", PublicCard: true}, "on (unfurl bots see its link card without a token)"},
		{swclient.Sandbox{ID: "abc", State: "running", Access: "private"}, ""},
	} {
		var b bytes.Buffer
		if err := writeRecord(&b, &tc.r, now); err != nil {
			t.Fatal(err)
		}
		if got := parseRecordLines(b.String())["public card"]; got != tc.want {
			t.Errorf("public_card %v: %q, want %q\n%s", tc.r.PublicCard, got, tc.want, b.String())
		}
	}
}

// TestCreateServiceFlag: on the real engine, create --service makes a
// group whose app reaches its service on localhost, get prints the
// service, and a bad --service fails before any call, naming the key.
func TestCreateServiceFlag(t *testing.T) {
	h := newHarness(t, "")
	ctx := context.Background()
	api := []string{"--api", h.APIURL(""), "--token", gatewaytest.Token}
	id := testenv.UniqueID("cli")
	t.Cleanup(func() {
		testenv.Eventually(t, 60*time.Second, func() (bool, string) {
			status := h.API("DELETE", "/v1/sandboxes/"+id, nil, nil)
			return status == http.StatusNoContent || status == http.StatusNotFound, fmt.Sprintf("destroy: %d", status)
		})
		h.API("POST", "/v1/sandboxes/"+id+"/purge", nil, nil)
	})
	runCLI(t, ctx, append([]string{"create", "--id", id, "--image", h.Image, "--port", "8080",
		"--service", "db=" + h.Image + ",ready=http:5432/healthz,memory_mb=96,env.PORT=5432,env.LISTEN_HOST=127.0.0.1"}, api...)...).ok(t, "create --service")
	resp, body := h.Preview("GET", h.Host(id, 8080), "/fetch?url=http://localhost:5432/healthz", nil, nil)
	if resp.StatusCode != 200 || body != "ok 200 ok\n" {
		t.Fatalf("the app fetching its service: %d %q", resp.StatusCode, body)
	}
	kv := parseRecordLines(runCLI(t, ctx, append([]string{"get", id}, api...)...).ok(t, "get"))
	if want := "running, 96 MiB, " + h.Image + ", ready http:5432/healthz"; kv["service db"] != want || !strings.HasSuffix(kv["group memory"], "MiB (app and services)") {
		t.Fatalf("get printed %v, want service db %q", kv, want)
	}
	runCLI(t, ctx, append([]string{"create", "--image", h.Image, "--port", "8080", "--service", "db=pg,port=5432"}, api...)...).
		failed(t, "unknown key", `create: --service db: unknown key "port"`)
	runCLI(t, ctx, append([]string{"create", "--image", h.Image, "--port", "8080", "--service", "db=" + h.Image + ",ready=udp:1"}, api...)...).
		failed(t, "a bad ready", "services.db.ready")
}
