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
	if err := lifecycle.CheckServices(spec.Services); err != nil {
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

// unmarshalService parses `service <name> { image …; cmd …; env K V;
// memory_mb N; cpus X; disk_mb N; ready tcp:5432; workspace_path /x;
// depends_on a b }` inside template t's block.
func unmarshalService(d *caddyfile.Dispenser, t string) (string, client.Service, error) {
	var svc client.Service
	var name string
	if !d.Args(&name) || d.NextArg() {
		return "", svc, d.ArgErr()
	}
	one := func(field string) (string, error) {
		var v string
		if !d.AllArgs(&v) {
			return "", d.Errf("template %s: service %s: %s wants one value", t, name, field)
		}
		return v, nil
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		switch field {
		case "image", "ready", "workspace_path":
			v, err := one(field)
			if err != nil {
				return "", svc, err
			}
			*map[string]*string{"image": &svc.Image, "ready": &svc.Ready, "workspace_path": &svc.WorkspacePath}[field] = v
		case "memory_mb", "disk_mb":
			v, err := one(field)
			if err != nil {
				return "", svc, err
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return "", svc, d.Errf("template %s: service %s: %s %q: want a whole number", t, name, field, v)
			}
			*map[string]*int64{"memory_mb": &svc.MemoryMB, "disk_mb": &svc.DiskMB}[field] = n
		case "cpus":
			v, err := one(field)
			if err != nil {
				return "", svc, err
			}
			if svc.CPUs, err = strconv.ParseFloat(v, 64); err != nil {
				return "", svc, d.Errf("template %s: service %s: cpus %q: want a number of cores such as 1 or 0.5", t, name, v)
			}
		case "cmd", "depends_on":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return "", svc, d.Errf("template %s: service %s: %s wants at least one value", t, name, field)
			}
			if field == "cmd" {
				svc.Cmd = args
			} else {
				svc.DependsOn = append(svc.DependsOn, args...)
			}
		case "env":
			var k, v string
			if !d.Args(&k, &v) || d.NextArg() {
				return "", svc, d.Errf("template %s: service %s: env wants a name and a value", t, name)
			}
			if svc.Env == nil {
				svc.Env = map[string]string{}
			}
			svc.Env[k] = v
		default:
			return "", svc, d.Errf("template %s: service %s: unknown field %q (image, cmd, env, memory_mb, cpus, disk_mb, ready, workspace_path, depends_on)", t, name, field)
		}
	}
	return name, svc, nil
}

// unmarshalTemplate parses `template <name> { <create field> <value>…
// service <name> {…} pool {…} }`.
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
			var on bool
			if on, err = onOff(d, "template "+tc.Name+": "+field); err == nil {
				r.ReadonlyRootfs = &on
			}
		case "public_card":
			r.PublicCard, err = onOff(d, "template "+tc.Name+": "+field)
		case "egress":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return tc, d.ArgErr()
			}
			r.Egress = &client.Egress{Policy: args[0]}
			if len(args) > 1 {
				r.Egress.Allow = args[1:]
			}
		case "egress_deny":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return tc, d.ArgErr()
			}
			if r.Egress == nil {
				r.Egress = &client.Egress{}
			}
			r.Egress.Deny = append(r.Egress.Deny, args...)
		case "activity":
			if !d.AllArgs(&r.Activity) {
				return tc, d.ArgErr()
			}
		case "service":
			name, svc, serr := unmarshalService(d, tc.Name)
			if serr != nil {
				return tc, serr
			}
			if _, dup := r.Services[name]; dup {
				return tc, d.Errf("template %s: service %s is defined twice", tc.Name, name)
			}
			if r.Services == nil {
				r.Services = map[string]client.Service{}
			}
			r.Services[name] = svc
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
			return tc, d.Errf("template %s: unknown field %q (the create fields: image, cmd, env, ports, memory_mb, cpus, disk_mb, workspace_path, ready_path, ready_mode, idle_pause, idle_stop, max_lifetime, label, access, public_card, egress, egress_deny, activity, user, readonly_rootfs, cap_add, runtime; service <name> { … } and pool { … })", tc.Name, field)
		}
		if err != nil {
			return tc, err
		}
	}
	return tc, nil
}
