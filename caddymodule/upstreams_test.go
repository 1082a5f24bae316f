package caddymodule

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/preview"
)

// TestUpstreamsAreFreshPerRequest: reverse_proxy writes to the upstreams a
// dynamic source returns, so each request must get its own (sharing them
// raced under load).
func TestUpstreamsAreFreshPerRequest(t *testing.T) {
	r := httptest.NewRequest("GET", "http://s-hot-8080.preview.localhost:8080/", nil)
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	if _, err := (Upstreams{}).GetUpstreams(r); err != errNoUpstream {
		t.Fatalf("without the gate: %v", err)
	}
	caddyhttp.SetVar(r.Context(), preview.VarUpstream, &gateway.UpstreamSet{Dial: "127.0.0.1:9"})
	a, err1 := Upstreams{}.GetUpstreams(r)
	b, err2 := Upstreams{}.GetUpstreams(r)
	if err1 != nil || err2 != nil || len(a) != 1 || a[0].Dial != "127.0.0.1:9" || a[0] == b[0] {
		t.Fatalf("upstreams %v %v (%v, %v)", a, b, err1, err2)
	}
}
