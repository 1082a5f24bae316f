package gateway

import (
	"context"
	"net/http"
	"net/netip"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestStreamLimiter(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	a, b, c := p("192.0.2.1/32"), p("192.0.2.2/32"), p("2001:db8::/64")
	tests := []struct {
		name           string
		max, perClient int
		clients        []netip.Prefix
		want           []int // status of each acquire; 0: admitted
	}{
		{"per client", 0, 2, []netip.Prefix{a, a, a, b}, []int{0, 0, 429, 0}},
		{"overall", 3, 0, []netip.Prefix{a, b, c, c}, []int{0, 0, 0, 503}},
		{"client cap first", 2, 1, []netip.Prefix{a, a, b, c}, []int{0, 429, 0, 503}},
		{"no caps", 0, 0, []netip.Prefix{a, a, a}, []int{0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewStreamLimiter()
			l.Configure(tt.max, tt.perClient)
			var releases []func()
			for i, cl := range tt.clients {
				release, status := l.Acquire(cl)
				if status != tt.want[i] {
					t.Fatalf("acquire #%d (%s) = %d, want %d", i, cl, status, tt.want[i])
				}
				if release != nil {
					releases = append(releases, release)
				}
			}
			for _, r := range releases {
				r()
				r() // a second release is a no-op
			}
			if total, _ := l.Open(a); total != 0 || len(l.byClient) != 0 {
				t.Fatalf("after every release: %d open, %d clients", total, len(l.byClient))
			}
		})
	}
}

func TestStreamClient(t *testing.T) {
	tests := []struct{ remote, clientIP, want string }{
		{"192.0.2.7:5000", "", "192.0.2.7/32"},
		{"192.0.2.7:5000", "198.51.100.9", "198.51.100.9/32"}, // resolved by Caddy (trusted proxy)
		{"[2001:db8:1:2:3:4:5:6]:443", "", "2001:db8:1:2::/64"},
		{"[::ffff:192.0.2.7]:80", "", "192.0.2.7/32"},
		{"garbage", "", "invalid Prefix"},
	}
	for _, tt := range tests {
		r, _ := http.NewRequest("GET", "/", nil)
		r.RemoteAddr = tt.remote
		if tt.clientIP != "" {
			ctx := context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: tt.clientIP})
			r = r.WithContext(ctx)
		}
		if got := StreamClient(r).String(); got != tt.want {
			t.Errorf("streamClient(%s, %q) = %s, want %s", tt.remote, tt.clientIP, got, tt.want)
		}
	}
}
