package caddymodule

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sandwake/sandwake/client"
)

// TestTemplateServicesCaddyfile: a template's service blocks adapt to its
// services under the API's names, and a service that is wrong whatever
// the gateway's settings (a name, a missing image, a ready probe,
// depends_on) is refused when the config loads, naming the service.
func TestTemplateServicesCaddyfile(t *testing.T) {
	good := `{
	sandwake {
		template preview {
			image app:1
			ports 3000
			service db {
				image postgres:17
				cmd postgres -c fsync=off
				env POSTGRES_PASSWORD dev
				env PGDATA /var/lib/postgresql/data
				memory_mb 256
				cpus 0.5
				disk_mb 500
				ready tcp:5432
				workspace_path /var/lib/postgresql
			}
			service cache {
				image redis:7
				ready tcp:6379
			}
			service worker {
				image app:1
				cmd node worker.js
				depends_on db
				depends_on cache
			}
			pool {
				min_idle 1
			}
		}
	}
}
`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(good), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			Sandwake App `json:"sandwake"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	app := cfg.Apps.Sandwake
	if len(app.Templates) != 1 {
		t.Fatalf("templates: %s", out)
	}
	want := map[string]client.Service{
		"db": {Image: "postgres:17", Cmd: []string{"postgres", "-c", "fsync=off"}, Env: map[string]string{"POSTGRES_PASSWORD": "dev", "PGDATA": "/var/lib/postgresql/data"},
			MemoryMB: 256, CPUs: 0.5, DiskMB: 500, Ready: "tcp:5432", WorkspacePath: "/var/lib/postgresql"},
		"cache":  {Image: "redis:7", Ready: "tcp:6379"},
		"worker": {Image: "app:1", Cmd: []string{"node", "worker.js"}, DependsOn: []string{"db", "cache"}},
	}
	if got := app.Templates[0].Services; !reflect.DeepEqual(got, want) {
		t.Fatalf("services: %+v\nwant %+v\nfrom %s", got, want, out)
	}
	if !strings.Contains(string(out), `"services":{"cache":{"image":"redis:7","ready":"tcp:6379"},"db":{"image":"postgres:17"`) {
		t.Errorf("adapted config lacks the services under the API's names:\n%s", out)
	}
	if err := app.provisionTemplates(); err != nil {
		t.Fatal(err)
	}
	if db := app.templates[0].Spec.Services["db"]; db.Ready != "tcp:5432" || db.MemoryMB != 256 || len(app.templates[0].Spec.Services) != 3 {
		t.Fatalf("provisioned services: %+v", app.templates[0].Spec.Services)
	}

	tmpl := func(body string) string {
		return "{\n\tsandwake {\n\t\ttemplate web {\n\t\t\timage app:1\n\t\t\tports 80\n" + body + "\n\t\t}\n\t}\n}\n"
	}
	for _, c := range []struct{ body, want string }{
		{"service db {\n\tport 5432\n}", `template web: service db: unknown field "port"`},
		{"service db {\n\tmemory_mb lots\n}", `service db: memory_mb "lots": want a whole number`},
		{"service db {\n\tcpus half\n}", `service db: cpus "half"`},
		{"service db {\n\tenv A\n}", `service db: env wants a name and a value`},
		{"service db {\n\timage a b\n}", `service db: image wants one value`},
		{"service db {\n\tdepends_on\n}", `service db: depends_on wants at least one value`},
		{"service {\n\timage pg\n}", `wrong argument count`},
		{"service db {\n\timage pg\n}\nservice db {\n\timage pg\n}", `service db is defined twice`},
		{"service db {\n\timage pg\n\tready udp:5432\n}", `services.db.ready`},
		{"service db {\n\tready tcp:5432\n}", `services.db.image: required`},
		{"service net {\n\timage pg\n}", `"net" is not a service name`},
		{"service db {\n\timage pg\n\tdepends_on cache\n}", `depends on "cache", which is not one of its services`},
		{"service a {\n\timage pg\n\tdepends_on b\n}\nservice b {\n\timage pg\n\tdepends_on a\n}", `cycle: a → b → a`},
	} {
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(tmpl(c.body)), nil)
		if err == nil {
			// What the Caddyfile reads, the provisioning checks.
			var cfg struct {
				Apps struct {
					Sandwake App `json:"sandwake"`
				} `json:"apps"`
			}
			if jerr := json.Unmarshal(out, &cfg); jerr != nil {
				t.Fatal(jerr)
			}
			err = cfg.Apps.Sandwake.provisionTemplates()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.body, err, c.want)
		}
	}
}

// TestTemplateCaddyfile: a template block adapts to the app's templates,
// each field under its API name, and bad ones are refused with the field.
func TestTemplateCaddyfile(t *testing.T) {
	good := `{
	sandwake {
		pool_memory_max 2GiB
		template web {
			image node:22
			ports 3000 9229
			memory_mb 256
			cmd node server.js
			env NODE_ENV production
			ready_path /health
			idle_pause 5m
			label team web
			egress public
			egress_deny pastebin.com 203.0.113.0/24
			activity any
			access private
			public_card
			pool {
				min_idle 2
				max_idle 4
				state running
				max_age 2h
			}
		}
	}
}
`
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(good), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"pool_memory_max":"2GiB"`, `"templates":[{"name":"web"`, `"image":"node:22"`, `"ports":[3000,9229]`,
		`"memory_mb":256`, `"cmd":["node","server.js"]`, `"env":{"NODE_ENV":"production"}`, `"ready_path":"/health"`,
		`"idle_pause":"5m"`, `"labels":{"team":"web"}`, `"egress":{"policy":"public","deny":["pastebin.com","203.0.113.0/24"]}`, `"activity":"any"`,
		`"access":"private"`, `"public_card":true`, `"pool":{"min_idle":2,"max_idle":4,"state":"running","max_age":7200000000000}`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted config lacks %s:\n%s", want, out)
		}
	}
	var cfg struct {
		Apps struct {
			Sandwake App `json:"sandwake"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	app := cfg.Apps.Sandwake
	if err := app.provisionTemplates(); err != nil {
		t.Fatal(err)
	}
	if tm := app.templates[0]; tm.Pool.MinIdle != 2 || tm.Pool.MaxAge != 2*time.Hour || tm.Spec.ReadyPath != "/health" || !tm.Spec.PublicCard || app.poolMemoryMaxMB != 2048 {
		t.Fatalf("provisioned: %+v, pool memory %d", tm, app.poolMemoryMaxMB)
	}
	for _, c := range []struct{ body, want string }{
		{"template web {\n\t\t\tports x\n\t\t}", `ports "x"`},
		{"template web {\n\t\t\tcolour red\n\t\t}", `unknown field "colour"`},
		{"template web {\n\t\t\tpublic_card yes\n\t\t}", `public_card: want no argument, on or off`},
		{"template web {\n\t\t\tpool {\n\t\t\t\tsize 3\n\t\t\t}\n\t\t}", `unknown pool option "size"`},
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("{\n\tsandwake {\n\t\t"+c.body+"\n\t}\n}\n"), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.body, err, c.want)
		}
	}
	for _, c := range []struct {
		tc   TemplateConfig
		want string
	}{
		{TemplateConfig{Name: "web", CreateRequest: client.CreateRequest{Ports: []int{80}}}, "image is required"},
		{TemplateConfig{Name: "Web!", CreateRequest: client.CreateRequest{Image: "a", Ports: []int{80}}}, "name must be"},
		{TemplateConfig{Name: "web", CreateRequest: client.CreateRequest{Image: "a", Ports: []int{80}}, Pool: &PoolOptions{MinIdle: 3, MaxIdle: 2}}, "max_idle 2 is below min_idle 3"},
		{TemplateConfig{Name: "web", CreateRequest: client.CreateRequest{Image: "a", Ports: []int{80}}, Pool: &PoolOptions{State: "frozen"}}, `state "frozen"`},
		{TemplateConfig{Name: "web", CreateRequest: client.CreateRequest{ID: "x", Image: "a", Ports: []int{80}}}, "belong to a create"},
	} {
		if _, err := c.tc.template(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.tc, err, c.want)
		}
	}
}
