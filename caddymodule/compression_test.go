package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestWithoutCompression: a sandwake_preview block's own http transport
// gets compression off unless it sets compression itself; other
// transports are left as they are.
func TestWithoutCompression(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"protocol":"http","dial_timeout":2000000000}`, `{"compression":false,"dial_timeout":2000000000,"protocol":"http"}`},
		{`{"protocol":"http","compression":false}`, `{"protocol":"http","compression":false}`},
		{`{"protocol":"fastcgi","root":"/srv"}`, `{"protocol":"fastcgi","root":"/srv"}`},
		{`not json`, `not json`},
	} {
		if got := string(withoutCompression([]byte(tc.in))); got != tc.want {
			t.Errorf("withoutCompression(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestPreviewBlockReachesReverseProxy: a sandwake_preview block's
// subdirectives are reverse_proxy's, with a matcher or without (the block
// was dropped: ExtractMatcherSet rewinds the dispenser before the
// directive's name, and the segment then began with an empty token).
func TestPreviewBlockReachesReverseProxy(t *testing.T) {
	for _, site := range []string{
		":8080 {\n\tsandwake_preview {\n\t\tflush_interval -1\n\t\ttransport http {\n\t\t\tdial_timeout 2s\n\t\t}\n\t}\n}\n",
		":8080 {\n\t@p host *.preview.localhost\n\tsandwake_preview @p {\n\t\tflush_interval -1\n\t\ttransport http {\n\t\t\tdial_timeout 2s\n\t\t}\n\t}\n}\n",
	} {
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), nil)
		if err != nil {
			t.Fatalf("adapting %q: %v", site, err)
		}
		for _, want := range []string{`"flush_interval":-1`, `"dial_timeout":2000000000`, `"compression":false`} {
			if !strings.Contains(string(out), want) {
				t.Errorf("%q adapted without %s:\n%s", site, want, out)
			}
		}
	}
}
