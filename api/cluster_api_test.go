package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/gatewaytest"
)

// TestSingleHostHasNoNodes: without a cluster block the node endpoints
// answer 404 not_clustered with a clear message, a record's node is the
// instance name, readyz has no cluster check, and a forward header means
// nothing to the preview gate.
func TestSingleHostHasNoNodes(t *testing.T) {
	h := newHarness(t, "instance single-host")
	for _, call := range []struct{ method, path, body string }{
		{"GET", "/v1/nodes", ""},
		{"POST", "/v1/nodes/x/drain", `{"draining":true}`},
		{"DELETE", "/v1/nodes/x", ""},
	} {
		req, _ := http.NewRequest(call.method, h.APIURL(call.path), bytes.NewReader([]byte(call.body)))
		req.Header.Set("Authorization", "Bearer "+gatewaytest.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e client.ErrorResponse
		json.Unmarshal(b, &e)
		if resp.StatusCode != 404 || e.Error.Code != "not_clustered" || e.Error.Message == "" {
			t.Fatalf("%s %s on a single host: %d %s", call.method, call.path, resp.StatusCode, b)
		}
	}
	rec := h.Create(nil)
	if rec.Node != "single-host" {
		t.Fatalf("record node %q, want the instance name", rec.Node)
	}
	var list struct{ Sandboxes []client.Sandbox }
	if h.API("GET", "/v1/sandboxes", nil, &list) != 200 || len(list.Sandboxes) != 1 || list.Sandboxes[0].Node != "single-host" {
		t.Fatalf("list: %+v", list)
	}
	var ready struct {
		Node   string            `json:"node"`
		Checks map[string]string `json:"checks"`
	}
	if h.API("GET", "/v1/readyz", nil, &ready) != 200 || ready.Node != "single-host" {
		t.Fatalf("readyz: %+v", ready)
	}
	if _, ok := ready.Checks["cluster"]; ok {
		t.Fatalf("readyz has a cluster check on a single host: %+v", ready.Checks)
	}
	resp, body := h.Preview("GET", h.Host(rec.ID, 8080), "/healthz", nil, http.Header{"Sandwake-Forwarded": {"x;1;00"}})
	if resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("preview with a forward header on a single host: %d %q", resp.StatusCode, body)
	}
}
