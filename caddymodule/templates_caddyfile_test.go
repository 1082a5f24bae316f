package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sandwake/sandwake/client"
)

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
			egress none
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
		`"idle_pause":"5m"`, `"labels":{"team":"web"}`, `"egress":{"policy":"none"}`,
		`"pool":{"min_idle":2,"max_idle":4,"state":"running","max_age":7200000000000}`} {
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
	if tm := app.templates[0]; tm.Pool.MinIdle != 2 || tm.Pool.MaxAge != 2*time.Hour || tm.Spec.ReadyPath != "/health" || app.poolMemoryMaxMB != 2048 {
		t.Fatalf("provisioned: %+v, pool memory %d", tm, app.poolMemoryMaxMB)
	}
	for _, c := range []struct{ body, want string }{
		{"template web {\n\t\t\tports x\n\t\t}", `ports "x"`},
		{"template web {\n\t\t\tcolour red\n\t\t}", `unknown field "colour"`},
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
