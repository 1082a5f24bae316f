package caddymodule

import (
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestUpstreamsAreFreshPerRequest: reverse_proxy writes to the upstreams a
// dynamic source returns, so each request must get its own (sharing them
// raced under load).
func TestUpstreamsAreFreshPerRequest(t *testing.T) {
	r := hotRequest()
	if _, err := (Upstreams{}).GetUpstreams(r); err != errNoUpstream {
		t.Fatalf("without the gate: %v", err)
	}
	caddyhttp.SetVar(r.Context(), VarUpstream, &UpstreamSet{Dial: "127.0.0.1:9"})
	a, err1 := Upstreams{}.GetUpstreams(r)
	b, err2 := Upstreams{}.GetUpstreams(r)
	if err1 != nil || err2 != nil || len(a) != 1 || a[0].Dial != "127.0.0.1:9" || a[0] == b[0] {
		t.Fatalf("upstreams %v %v (%v, %v)", a, b, err1, err2)
	}
}
