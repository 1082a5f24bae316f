package caddymodule

import (
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sandwake/sandwake/api"
	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/lifecycle"
)

// TemplateConfig is a named sandbox shape (the app's templates): the create
// fields under their API names, and its warm pool.
type TemplateConfig struct {
	// Name is how creates refer to it ("template":"web").
	Name string `json:"name"`
	// The create fields (id, template and pool are not allowed here).
	client.CreateRequest
	// Pool is the template's warm pool; absent keeps none.
	Pool *PoolOptions `json:"pool,omitempty"`
}

// PoolOptions size a template's warm pool.
type PoolOptions struct {
	// MinIdle idle containers are kept ready; MaxIdle (default MinIdle)
	// caps them.
	MinIdle int `json:"min_idle,omitempty"`
	MaxIdle int `json:"max_idle,omitempty"`
	// State is paused (default) or running.
	State string `json:"state,omitempty"`
	// MaxAge replaces idle containers this old (0: never).
	MaxAge caddy.Duration `json:"max_age,omitempty"`
}

// provisionTemplates checks the templates and turns them into the engine's.
func (a *App) provisionTemplates() error {
	a.templates = a.templates[:0]
	seen := map[string]bool{}
	for _, tc := range a.Templates {
		t, err := tc.template()
		if err != nil {
			return fmt.Errorf("sandwake: %w", err)
		}
		if seen[t.Name] {
			return fmt.Errorf("sandwake: template %s is defined twice", t.Name)
		}
		seen[t.Name] = true
		a.templates = append(a.templates, t)
	}
	if a.PoolMemoryMax != "" {
		n, err := parseMemory(a.PoolMemoryMax)
		if err != nil {
			return fmt.Errorf("sandwake: pool_memory_max: %w", err)
		}
		a.poolMemoryMaxMB = int64(n >> 20)
	}
	return nil
}

// template converts tc to the engine's template, normalised.
func (tc *TemplateConfig) template() (lifecycle.Template, error) {
	if tc.ID != "" || tc.Template != "" || tc.CreateRequest.Pool != "" {
		return lifecycle.Template{}, fmt.Errorf("template %s: id, template and a pool mode belong to a create, not a template", tc.Name)
	}
	spec, err := api.Spec(tc.CreateRequest)
	if err != nil {
		return lifecycle.Template{}, fmt.Errorf("template %s: %w", tc.Name, err)
	}
	t := lifecycle.Template{Name: tc.Name, Spec: spec}
	if p := tc.Pool; p != nil {
		t.Pool = lifecycle.PoolConfig{MinIdle: p.MinIdle, MaxIdle: p.MaxIdle, State: p.State, MaxAge: time.Duration(p.MaxAge)}
	}
	if err := lifecycle.NormalizeTemplate(&t); err != nil {
		return lifecycle.Template{}, err
	}
	return t, nil
}

// unmarshalTemplate parses `template <name> { <create field> <value>… pool {…} }`.
func unmarshalTemplate(d *caddyfile.Dispenser) (TemplateConfig, error) {
	var tc TemplateConfig
	if !d.NextArg() {
		return tc, d.ArgErr()
	}
	tc.Name = d.Val()
	if d.NextArg() {
		return tc, d.ArgErr()
	}
	r := &tc.CreateRequest
	one := func() (string, error) {
		var v string
		if !d.AllArgs(&v) {
			return "", d.ArgErr()
		}
		return v, nil
	}
	integer := func(field string) (int64, error) {
		v, err := one()
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, d.Errf("template %s: %s %q: want a whole number", tc.Name, field, v)
		}
		return n, nil
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		var err error
		switch field {
		case "image", "workspace_path", "ready_path", "ready_mode", "access", "user", "runtime":
			var v string
			if v, err = one(); err == nil {
				*map[string]*string{"image": &r.Image, "workspace_path": &r.WorkspacePath, "ready_path": &r.ReadyPath,
					"ready_mode": &r.ReadyMode, "access": &r.Access, "user": &r.User, "runtime": &r.Runtime}[field] = v
			}
		case "idle_pause", "idle_stop", "max_lifetime":
			var v string
			if v, err = one(); err == nil {
				*map[string]**string{"idle_pause": &r.IdlePause, "idle_stop": &r.IdleStop, "max_lifetime": &r.MaxLifetime}[field] = &v
			}
		case "memory_mb", "disk_mb":
			var n int64
			if n, err = integer(field); err == nil {
				*map[string]*int64{"memory_mb": &r.MemoryMB, "disk_mb": &r.DiskMB}[field] = n
			}
		case "cpus":
			var v string
			if v, err = one(); err == nil {
				if r.CPUs, err = strconv.ParseFloat(v, 64); err != nil {
					err = d.Errf("template %s: cpus %q: want a number of cores such as 1 or 0.5", tc.Name, v)
				}
			}
		case "ports":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return tc, d.ArgErr()
			}
			for _, a := range args {
				p, perr := strconv.Atoi(a)
				if perr != nil {
					return tc, d.Errf("template %s: ports %q: want port numbers", tc.Name, a)
				}
				r.Ports = append(r.Ports, p)
			}
		case "cmd":
			r.Cmd = d.RemainingArgs()
			if len(r.Cmd) == 0 {
				return tc, d.ArgErr()
			}
		case "cap_add":
			r.CapAdd = d.RemainingArgs()
			if len(r.CapAdd) == 0 {
				return tc, d.ArgErr()
			}
		case "env", "label":
			var k, v string
			if !d.Args(&k, &v) || d.NextArg() {
				return tc, d.ArgErr()
			}
			m := &r.Env
			if field == "label" {
				m = &r.Labels
			}
			if *m == nil {
				*m = map[string]string{}
			}
			(*m)[k] = v
		case "readonly_rootfs":
			on := true
			switch args := d.RemainingArgs(); {
			case len(args) == 0 || (len(args) == 1 && args[0] == "on"):
			case len(args) == 1 && args[0] == "off":
				on = false
			default:
				return tc, d.Errf("template %s: readonly_rootfs: want no argument, on or off", tc.Name)
			}
			r.ReadonlyRootfs = &on
		case "egress":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return tc, d.ArgErr()
			}
			r.Egress = &client.Egress{Policy: args[0], Allow: args[1:]}
		case "pool":
			if d.NextArg() {
				return tc, d.ArgErr()
			}
			tc.Pool = &PoolOptions{}
			for pn := d.Nesting(); d.NextBlock(pn); {
				opt := d.Val()
				switch opt {
				case "min_idle", "max_idle":
					n, ierr := integer(opt)
					if ierr != nil {
						return tc, ierr
					}
					*map[string]*int{"min_idle": &tc.Pool.MinIdle, "max_idle": &tc.Pool.MaxIdle}[opt] = int(n)
				case "state":
					if tc.Pool.State, err = one(); err != nil {
						return tc, err
					}
				case "max_age":
					v, verr := one()
					if verr != nil {
						return tc, verr
					}
					dur, derr := caddy.ParseDuration(v)
					if derr != nil {
						return tc, d.Errf("template %s: pool max_age %q: %v", tc.Name, v, derr)
					}
					tc.Pool.MaxAge = caddy.Duration(dur)
				default:
					return tc, d.Errf("template %s: unknown pool option %q (min_idle, max_idle, state, max_age)", tc.Name, opt)
				}
			}
		default:
			return tc, d.Errf("template %s: unknown field %q (the create fields: image, cmd, env, ports, memory_mb, cpus, disk_mb, workspace_path, ready_path, ready_mode, idle_pause, idle_stop, max_lifetime, label, access, egress, user, readonly_rootfs, cap_add, runtime; and pool { … })", tc.Name, field)
		}
		if err != nil {
			return tc, err
		}
	}
	return tc, nil
}
