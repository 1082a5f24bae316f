package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	swclient "github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestDuplicateKeysThroughTheAPI: through a real gateway, a body with a
// key given twice is a 400 naming the key and where it is, for a create,
// a create from a template, a PATCH and a PATCH of the egress policy;
// nothing is created or changed (encoding/json alone would have kept the
// last value: {"id":"x1",…,"id":"x2"} created x2).
func TestDuplicateKeysThroughTheAPI(t *testing.T) {
	h := newHarness(t, fmt.Sprintf("template web {\n\t\t\timage %s\n\t\t\tports 8080\n\t\t}", testenv.TestAppImage(t)))
	rec := h.Create(nil)
	x1, x2 := testenv.UniqueID("d"), testenv.UniqueID("d")
	h.RemoveOnCleanup(x1)
	h.RemoveOnCleanup(x2)
	for _, tc := range []struct {
		name, method, path, body, want string
	}{
		{"create", "POST", "/v1/sandboxes",
			fmt.Sprintf(`{"id":%q,"image":%q,"ports":[8080],"id":%q}`, x1, h.Image, x2), `duplicate key "id"`},
		{"create from a template", "POST", "/v1/sandboxes",
			fmt.Sprintf(`{"id":%q,"template":"web","template":"web"}`, x1), `duplicate key "template"`},
		{"patch", "PATCH", "/v1/sandboxes/" + rec.ID, `{"access":"private","access":"public"}`, `duplicate key "access"`},
		{"patch egress", "PATCH", "/v1/sandboxes/" + rec.ID, `{"egress":{"policy":"none","allow":["a.example"],"allow":["b.example"]}}`, `egress: duplicate key "allow"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := h.apiRaw(tc.method, tc.path, "Bearer "+gatewaytest.Token, strings.NewReader(tc.body))
			if e := a.errorBody(t); a.status != http.StatusBadRequest || e.Code != "invalid" || !strings.HasPrefix(e.Message, tc.want) {
				t.Fatalf("%s %s: %d %+v, want 400 invalid %q", tc.method, tc.path, a.status, e, tc.want)
			}
		})
	}
	for _, id := range []string{x1, x2} {
		if code := h.API("GET", "/v1/sandboxes/"+id, nil, nil); code != http.StatusNotFound {
			t.Errorf("a refused create made %s: %d", id, code)
		}
	}
	var got swclient.Sandbox
	h.API("GET", "/v1/sandboxes/"+rec.ID, nil, &got)
	if got.Access != rec.Access || (got.Egress != nil && len(got.Egress.Allow) > 0) {
		t.Errorf("a refused PATCH changed the sandbox: access %q egress %+v", got.Access, got.Egress)
	}
}
