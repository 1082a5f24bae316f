package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sandwake/sandwake/api"
)

func init() {
	caddy.RegisterModule(API{})
}

// API is the management REST API handler (http.handlers.sandwake_api): it
// hands every request to the API (package api). Every route but
// /v1/healthz and /v1/readyz needs "Authorization: Bearer <token>".
type API struct {
	api.Config

	h *api.Handler
}

// TokenConfig is one API token and what it may do (see api.TokenConfig).
type TokenConfig = api.TokenConfig

// CaddyModule returns the Caddy module information.
func (API) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.sandwake_api",
		New: func() caddy.Module { return new(API) },
	}
}

// Provision resolves the tokens and builds the routes.
func (a *API) Provision(ctx caddy.Context) error {
	app, err := sandwakeApp(ctx, "sandwake_api")
	if err != nil {
		return err
	}
	if a.h, err = api.New(a.Config, app.gateway, ctx.Logger()); err != nil {
		return err
	}
	// Its event streams end when its server shuts down (see Gate).
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil {
		srv.RegisterOnShutdown(a.h.Shutdown)
	}
	app.Cluster.registerAPI(a.h) // in a cluster, it serves the API calls other nodes forward
	return nil
}

// Validate refuses an API without authentication unless that is explicit.
func (a *API) Validate() error { return a.Config.Validate() }

// ServeHTTP implements caddyhttp.MiddlewareHandler. The API answers every
// request it is given.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	a.h.ServeHTTP(w, r)
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*API)(nil)
	_ caddy.Validator             = (*API)(nil)
	_ caddyhttp.MiddlewareHandler = (*API)(nil)
)
