package caddymodule

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestOwnershipOptions: the instance, network, memory and image-policy
// options are parsed, defaulted and validated, with errors that name them.
func TestOwnershipOptions(t *testing.T) {
	tests := []struct {
		name    string
		input   string
		wantErr string // "" when valid
		check   func(t *testing.T, a *App)
	}{
		{"defaults", "", "", func(t *testing.T, a *App) {
			if a.Instance != "" || a.SandboxNetwork != "" || a.Pull != "missing" || a.defaultMemMB != 512 || a.AllowedImages != nil {
				t.Fatalf("defaults: instance %q network %q pull %q default memory %d MiB allowed %v", a.Instance, a.SandboxNetwork, a.Pull, a.defaultMemMB, a.AllowedImages)
			}
		}},
		{"all set", "instance production\nsandbox_network previews-net\ndefault_memory 1GiB\npull never\nallowed_images registry.example.com/previews/* node:*\nallowed_images sandwake-*", "", func(t *testing.T, a *App) {
			want := []string{"registry.example.com/previews/*", "node:*", "sandwake-*"}
			if a.Instance != "production" || a.SandboxNetwork != "previews-net" || a.Pull != "never" || a.defaultMemMB != 1024 || !reflect.DeepEqual(a.AllowedImages, want) {
				t.Fatalf("got instance %q network %q pull %q default memory %d allowed %v", a.Instance, a.SandboxNetwork, a.Pull, a.defaultMemMB, a.AllowedImages)
			}
		}},
		{"default memory off", "default_memory 0", "", func(t *testing.T, a *App) {
			if a.defaultMemMB != 0 {
				t.Fatalf("default memory %d, want 0 (off)", a.defaultMemMB)
			}
		}},
		{"instance upper case", "instance Prod", "instance", nil},
		{"instance with slash", "instance a/b", "instance", nil},
		{"instance starting with dash", "instance -x", "instance", nil},
		{"instance too long", "instance " + strings.Repeat("a", 64), "instance", nil},
		{"network with space", `sandbox_network "a b"`, "sandbox_network", nil},
		{"pull sometimes", "pull sometimes", "pull", nil},
		{"pull always with registries", "pull always\nallowed_registries ghcr.io registry.example.com:5000\nallowed_registries docker.io", "", func(t *testing.T, a *App) {
			if a.Pull != "always" || !reflect.DeepEqual(a.AllowedRegistries, []string{"ghcr.io", "registry.example.com:5000", "docker.io"}) {
				t.Fatalf("pull %q allowed registries %v", a.Pull, a.AllowedRegistries)
			}
		}},
		{"registry with a path", "allowed_registries ghcr.io/acme", "allowed_registries", nil},
		{"registry with a scheme", "allowed_registries https://ghcr.io", "allowed_registries", nil},
		{"default memory share", "default_memory 10%", "default_memory", nil},
		{"default memory tiny", "default_memory 1MiB", "default_memory", nil},
		{"allowed image bad pattern", "allowed_images [", "allowed_images", nil},
		{"instance twice args", "instance a b", "wrong argument", nil},
		{"option given twice", "idle_pause 3m\nidle_pause 5m", "given twice", nil},
		{"instance given twice", "instance a\ninstance b", "given twice", nil},
		{"labels add up", "label a b\nlabel c d", "", func(t *testing.T, a *App) {
			if len(a.Labels) != 2 {
				t.Fatalf("labels %v, want both", a.Labels)
			}
		}},
		// As docs/caddyfile.md says: templates and the egress lists add up
		// (two templates were refused as "given twice").
		{"templates and egress lists add up", "template a {\nimage x\nports 80\n}\ntemplate b {\nimage y\nports 81\n}\n" +
			"egress_deny 203.0.113.0/24\negress_deny 198.51.100.0/24\negress_allow_private 10.1.2.3:5432\negress_allow_private 10.1.2.4:5432\n" +
			"egress_dns 10.0.0.2\negress_dns 10.0.0.3", "", func(t *testing.T, a *App) {
			if len(a.Templates) != 2 || len(a.EgressDeny) != 2 || len(a.EgressAllowPrivate) != 2 || len(a.EgressDNS) != 2 {
				t.Fatalf("templates %d, egress_deny %v, egress_allow_private %v, egress_dns %v: want two of each", len(a.Templates), a.EgressDeny, a.EgressAllowPrivate, a.EgressDNS)
			}
		}},
		{"egress by name", "egress learn\negress_allow Registry.NPMjs.org *.githubusercontent.com\negress_allow 198.51.100.7:443\nactivity any\nactive_max 2h", "", func(t *testing.T, a *App) {
			want := []string{"registry.npmjs.org", "*.githubusercontent.com", "198.51.100.7:443/tcp"}
			if a.egress.config.Default != "learn" || !reflect.DeepEqual(a.egress.config.DefaultAllow, want) || a.Activity != "any" || a.managerSettings().ActiveMax != 2*time.Hour {
				t.Fatalf("egress %q allow %v activity %q active_max %v", a.egress.config.Default, a.egress.config.DefaultAllow, a.Activity, a.managerSettings().ActiveMax)
			}
		}},
		{"egress_allow bad name", "egress_allow not..a.name", "not..a.name", nil},
		{"egress_allow dns port", "egress_allow 198.51.100.9:53/udp", "DNS port", nil},
		{"egress_allow private", "egress_allow 10.0.5.20:3142", "egress_allow_private", nil},
		{"egress_allow_private by name", "egress_allow_private mirror.internal.example", "a name", nil},
		{"activity bad", "activity sometimes", "activity", nil},
		{"active_max zero", "active_max 0", "active_max", nil},
		{"egress bad", "egress open", "public, none, learn or unenforced", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkOption(t, tt.input, tt.wantErr, tt.check) })
	}
}

// checkOption parses input as the body of the sandwake global option,
// provisions and validates the app, and wants an error naming wantErr
// ("": none), else runs check (when not nil) on the app.
func checkOption(t *testing.T, input, wantErr string, check func(*testing.T, *App)) {
	t.Helper()
	var a App
	err := a.UnmarshalCaddyfile(dispenserFor(t, "sandwake {\n"+input+"\n}"))
	if err == nil {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
		defer cancel()
		err = a.Provision(ctx)
	}
	if err == nil {
		err = a.Validate()
	}
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Fatalf("err = %v, want one naming %q", err, wantErr)
	case check != nil:
		check(t, &a)
	}
}
