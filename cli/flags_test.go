package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestCLIFlagNames: create takes the API's names (ports, memory_mb,
// ready_path) and the familiar ones (--ports, --memory) as its own flags;
// a mistyped flag gets "did you mean"; destroy says the volume is kept and
// how to purge it.
func TestCLIFlagNames(t *testing.T) {
	h := newHarness(t, "")
	ctx := context.Background()
	api := []string{"--api", h.APIURL(""), "--token", gatewaytest.Token}
	id := testenv.UniqueID("cli")
	h.RemoveOnCleanup(id)
	out := runCLI(t, ctx, append([]string{"create", "--image", h.Image, "--ports", "8080", "--memory", "64", "--ready_path", "/healthz", "--id", id, "--json"}, api...)...).ok(t, "create with the API's names")
	if !strings.Contains(out, `"memory_mb": 64`) || !strings.Contains(out, `"ready_path": "/healthz"`) {
		t.Fatalf("create with --ports/--memory/--ready_path: %s", out)
	}
	runCLI(t, ctx, append([]string{"create", "--imag", h.Image, "--port", "8080"}, api...)...).failed(t, "mistyped flag", "unknown flag: --imag; did you mean --image?")
	runCLI(t, ctx, append([]string{"create", "--image", h.Image, "--port", "8080", "--memroy-mb", "64"}, api...)...).failed(t, "mistyped flag", "did you mean --memory-mb?")
	runCLI(t, ctx, append([]string{"create", "--image", h.Image, "--port", "8080", "--zzz"}, api...)...).failed(t, "unknown flag", "unknown flag: --zzz (see")
	if out := runCLI(t, ctx, append([]string{"destroy", id}, api...)...).ok(t, "destroy"); !strings.Contains(out, "volume (workspace) is kept: caddy sandwake purge "+id) {
		t.Fatalf("destroy said %q, want it to say the volume is kept and how to purge it", out)
	}
}
