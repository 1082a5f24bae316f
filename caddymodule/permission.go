package caddymodule

import (
	"context"
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddytls"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/preview"
)

func init() {
	caddy.RegisterModule(Permission{})
}

// Permission is the on-demand TLS permission module tls.permission.sandwake:
// Caddy may obtain a certificate only for the preview host of an existing
// sandbox and one of its declared ports, so nobody can make the gateway mint
// certificates for names of their choosing (and burn the CA's rate limits).
//
//	tls {
//		on_demand
//	}
//	# global options:
//	on_demand_tls {
//		permission sandwake
//	}
type Permission struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (Permission) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "tls.permission.sandwake",
		New: func() caddy.Module { return new(Permission) },
	}
}

// Provision finds the sandwake app.
func (p *Permission) Provision(ctx caddy.Context) error {
	app, err := sandwakeApp(ctx, "tls.permission.sandwake")
	if err != nil {
		return err
	}
	p.app = app
	return nil
}

// CertificateAllowed implements caddytls.OnDemandPermission. It reads the
// route cache (the store on a miss), never Docker, and never wakes anything.
func (p *Permission) CertificateAllowed(_ context.Context, name string) error {
	e := p.app.engine()
	if e == nil || !e.Ready.Load() {
		return fmt.Errorf("%w: sandwake is not ready", caddytls.ErrPermissionDenied)
	}
	id, port, ok := preview.ParseHost(name, e.Current.Load().Domain)
	if !ok {
		return fmt.Errorf("%w: %s is not a preview host", caddytls.ErrPermissionDenied, name)
	}
	rt, err := e.Routes.Get(id)
	if errors.Is(err, lifecycle.ErrNotFound) {
		return fmt.Errorf("%w: no sandbox %s", caddytls.ErrPermissionDenied, id)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", caddytls.ErrPermissionDenied, err)
	}
	if !rt.Declares(port) {
		return fmt.Errorf("%w: sandbox %s does not serve port %d", caddytls.ErrPermissionDenied, id, port)
	}
	return nil
}

// UnmarshalCaddyfile: `permission sandwake` takes no options.
func (p *Permission) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Permission)(nil)
	_ caddytls.OnDemandPermission = (*Permission)(nil)
	_ caddyfile.Unmarshaler       = (*Permission)(nil)
)
