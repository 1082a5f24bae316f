package caddymodule

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/preview"
)

func init() {
	caddy.RegisterModule(Upstreams{})
}

// Upstreams is the dynamic upstream source
// http.reverse_proxy.upstreams.sandwake: it hands reverse_proxy the address the
// sandwake gate chose for the request's sandbox and port. It must run after
// the gate (the sandwake_preview directive arranges that).
type Upstreams struct{}

// CaddyModule returns the Caddy module information.
func (Upstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.sandwake",
		New: func() caddy.Module { return new(Upstreams) },
	}
}

var errNoUpstream = errors.New("sandwake: no upstream chosen for this request: the sandwake gate must run before reverse_proxy (use the sandwake_preview directive)")

// GetUpstreams implements reverseproxy.UpstreamSource.
func (Upstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	set, ok := caddyhttp.GetVar(r.Context(), preview.VarUpstream).(*gateway.UpstreamSet)
	if !ok || set == nil {
		return nil, errNoUpstream
	}
	// A fresh Upstream each time, as Caddy's own dynamic sources do:
	// reverse_proxy writes to the upstreams it is given.
	return []*reverseproxy.Upstream{{Dial: set.Dial}}, nil
}

// Interface guards.
var _ reverseproxy.UpstreamSource = (*Upstreams)(nil)
