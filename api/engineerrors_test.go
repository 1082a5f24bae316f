package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	swclient "github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// engineWords are what the engine's own error text is made of (its data
// directories, its runtime's and daemon's words): none may reach an API
// caller.
var engineWords = []string{"/var/lib/docker", "overlay", "_data", "/merged", "OCI runtime", "runc", "Error response from daemon", "containerd"}

// TestEngineErrorsNameNoHostInternals: on the real engine, a tenant's
// create whose service asks for a workspace under /proc is a 400 naming
// the service and the field, before the engine is asked; a create the
// engine fails for a reason no check foresees (a command that is not in
// the image, of the app or of a service) answers, and records, sandwake's
// words and a reference, never the engine's; the gateway's log has the
// engine's words under that reference, with the sandbox's id.
func TestEngineErrorsNameNoHostInternals(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	h := newHarnessWithCaddyfile(t, func(h *harness) string {
		c := strings.Replace(h.Caddyfile(""), "token "+gatewaytest.Token+"\n", fmt.Sprintf(`token %s
		token %s {
			scope admin
			labels tenant=acme
		}
`, gatewaytest.Token, acmeToken), 1)
		return strings.Replace(c, "\tauto_https off\n", "\tauto_https off\n\tlog {\n\t\toutput file "+logFile+"\n\t}\n", 1)
	})
	clean := func(what, msg string) {
		t.Helper()
		for _, w := range engineWords {
			if strings.Contains(msg, w) {
				t.Errorf("%s names the engine's internals (%q): %s", what, w, msg)
			}
		}
	}
	create := func(extra map[string]any) (string, int, swclient.ErrorResponse) {
		t.Helper()
		id := testenv.UniqueID("e")
		h.RemoveOnCleanup(id)
		body := map[string]any{"id": id, "image": h.Image, "ports": []int{8080}}
		for k, v := range extra {
			body[k] = v
		}
		code, raw := h.call(acmeToken, "POST", "/v1/sandboxes", body)
		clean("the answer to a create", raw)
		var e swclient.ErrorResponse
		if err := json.Unmarshal([]byte(raw), &e); err != nil && code >= 400 {
			t.Fatalf("create %v: %d %s: not the error JSON", extra, code, raw)
		}
		return id, code, e
	}

	// A service's workspace under /proc: refused before the engine.
	id, code, e := create(map[string]any{"services": map[string]any{"db": map[string]any{"image": h.Image, "workspace_path": "/proc"}}})
	if code != http.StatusBadRequest || e.Error.Code != "invalid" || !strings.Contains(e.Error.Message, "services.db.workspace_path") || !strings.Contains(e.Error.Message, `"/proc"`) {
		t.Fatalf("a service's workspace /proc: %d %+v, want 400 invalid naming services.db.workspace_path", code, e)
	}
	if code, _ := h.call(gatewaytest.Token, "GET", "/v1/sandboxes/"+id, nil); code != http.StatusNotFound {
		t.Fatalf("the refused create left a record: %d", code)
	}
	for _, p := range []string{"/sys/fs", "/dev", "/proc/../etc", "data"} {
		if _, code, e := create(map[string]any{"services": map[string]any{"db": map[string]any{"image": h.Image, "workspace_path": p}}}); code != http.StatusBadRequest || !strings.Contains(e.Error.Message, "services.db.workspace_path") {
			t.Errorf("a service's workspace %s: %d %+v, want 400 naming services.db.workspace_path", p, code, e)
		}
	}

	// The engine refuses what no check foresees: the answer, the record
	// and the log.
	ref := regexp.MustCompile(`ref ([0-9a-f]{8})`)
	for _, tc := range []struct {
		name  string
		extra map[string]any
	}{
		{"the app's command", map[string]any{"cmd": []string{"/nonexistent-" + testenv.RunID()}}},
		{"a service's command", map[string]any{"services": map[string]any{"db": map[string]any{"image": h.Image, "cmd": []string{"/nonexistent-" + testenv.RunID()}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, code, e := create(tc.extra)
			if code < 400 || e.Error.Message == "" {
				t.Fatalf("create: %d %+v, want a refusal", code, e)
			}
			t.Logf("answer: %d %s", code, e.Error.Message)
			m := ref.FindStringSubmatch(e.Error.Message)
			if m == nil || !strings.Contains(e.Error.Message, id) {
				t.Fatalf("answer %q: want the sandbox, sandwake's words and a log reference", e.Error.Message)
			}
			if _, raw := h.call(acmeToken, "GET", "/v1/sandboxes/"+id, nil); raw != "" {
				clean("the failed sandbox's record", raw)
			}
			// The log has the engine's words under the reference.
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				b, _ := os.ReadFile(logFile)
				for line := range strings.SplitSeq(string(b), "\n") {
					if strings.Contains(line, "ref "+m[1]) && strings.Contains(line, id) && strings.Contains(line, "nonexistent-") &&
						(strings.Contains(line, "OCI runtime") || strings.Contains(line, "no such file")) {
						return true, ""
					}
				}
				return false, fmt.Sprintf("no log line with ref %s, the id %s and the engine's words", m[1], id)
			})
		})
	}
}
