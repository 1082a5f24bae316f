package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sandwake/sandwake/preview"
)

func init() {
	caddy.RegisterModule(Gate{})
}

// Gate is the preview-host handler (http.handlers.sandwake): it hands every
// request to the preview path (package preview), which wakes, holds or
// passes it on to reverse_proxy. Use it through the sandwake_preview
// directive, which puts reverse_proxy with the sandwake upstream source
// after it.
type Gate struct {
	h *preview.Handler
}

// CaddyModule returns the Caddy module information.
func (Gate) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.sandwake",
		New: func() caddy.Module { return new(Gate) },
	}
}

// Provision finds the sandwake app (created with defaults when the config
// has no sandwake global option) and registers the metrics.
func (g *Gate) Provision(ctx caddy.Context) error {
	app, err := sandwakeApp(ctx, "sandwake gate")
	if err != nil {
		return err
	}
	g.h = preview.New(app.gateway, ctx.Logger())
	// The gate's event streams end when its server shuts down, which
	// would otherwise wait for them (Caddy's default grace period is
	// eternal, and a stop waits for the servers of earlier configs too).
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil {
		srv.RegisterOnShutdown(func() { g.h.Shutdown(caddy.Exiting()) })
	}
	// In a cluster, requests other nodes forward go through this
	// gate's server, as a visitor's would.
	app.Cluster.registerPreview(ctx)
	return registerMetrics(ctx.GetMetricsRegistry())
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (g *Gate) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// A request that names no encoding asks the app for none: Go's
	// transport would otherwise ask for gzip on the client's behalf and
	// inflate the answer on the gateway's CPU (1 MB of gzip can be 1 GB),
	// whatever transport a JSON config gives reverse_proxy (the
	// Caddyfile's has compression off as well).
	if _, ok := r.Header["Accept-Encoding"]; !ok {
		r.Header["Accept-Encoding"] = identityOnly
	}
	return g.h.ServeHTTP(w, r, next)
}

// identityOnly is the Accept-Encoding of a request that named none. A
// slice of one, never written: an Add by a later handler copies it.
var identityOnly = []string{"identity"}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Gate)(nil)
	_ caddyhttp.MiddlewareHandler = (*Gate)(nil)
)
