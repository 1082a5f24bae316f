package api_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// Tokens of TestScopedTokens.
const (
	readToken    = "read-token-0123456789"
	operateToken = "operate-token-0123456789"
	acmeToken    = "acme-token-0123456789"
	globexToken  = "globex-read-token-0123456789"
)

// scopedHarness is a harness whose API has, beside the admin gatewaytest.Token, a
// read token, an operate token, an admin token bound to tenant=acme and a
// read token bound to tenant=globex.
func scopedHarness(t *testing.T) *harness {
	return newHarnessWithCaddyfile(t, func(h *harness) string {
		return strings.Replace(h.Caddyfile(""), "token "+gatewaytest.Token+"\n", fmt.Sprintf(`token %s
		token %s {
			scope read
		}
		token %s {
			scope operate
		}
		token %s {
			scope admin
			labels tenant=acme
		}
		token %s {
			scope read
			labels tenant=globex
		}
`, gatewaytest.Token, readToken, operateToken, acmeToken, globexToken), 1)
	})
}

// call is an API call with a token; it answers the status and the body
// (compact JSON).
func (h *harness) call(token, method, path string, body any) (int, string) {
	h.T.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	a := h.apiRaw(method, path, "Bearer "+token, rd)
	var compact bytes.Buffer
	if json.Compact(&compact, a.body) == nil {
		return a.status, compact.String()
	}
	return a.status, string(a.body)
}

// TestScopedTokens: on the real engine, each scope does what it names and
// gets 403 forbidden, naming the scope needed, beyond it; a token bound to
// tenant=acme stamps its label on creates, may not claim another tenant's,
// and never sees another tenant's sandbox in list, get, operations,
// history or the event stream, nor acts on the nodes; whoami tells each
// token what it is.
func TestScopedTokens(t *testing.T) {
	h := scopedHarness(t)
	newID := func() string {
		id := testenv.UniqueID("g")
		h.RemoveOnCleanup(id)
		return id
	}
	spec := func(id string, labels map[string]string) map[string]any {
		return map[string]any{"id": id, "image": h.Image, "ports": []int{8080}, "labels": labels}
	}

	// The tenants' event streams, opened before anything happens.
	acmeEvents := h.eventsAs(t, acmeToken)
	globexEvents := h.eventsAs(t, globexToken)

	a := newID()
	if code, body := h.call(acmeToken, "POST", "/v1/sandboxes", spec(a, map[string]string{"app": "shop"})); code != 201 || !strings.Contains(body, `"tenant":"acme"`) || !strings.Contains(body, `"app":"shop"`) {
		t.Fatalf("create with the acme token: %d %s, want 201 stamped tenant=acme", code, body)
	}
	b := newID()
	if code, body := h.call(gatewaytest.Token, "POST", "/v1/sandboxes", spec(b, map[string]string{"tenant": "globex"})); code != 201 {
		t.Fatalf("create with the admin token: %d %s", code, body)
	}
	if code, body := h.call(acmeToken, "POST", "/v1/sandboxes", spec(newID(), map[string]string{"tenant": "globex"})); code != 403 || !strings.Contains(body, "forbidden") {
		t.Fatalf("acme creating a globex sandbox: %d %s, want 403 forbidden", code, body)
	}

	forbidden := []struct {
		token, method, path, need string
	}{
		{readToken, "POST", "/v1/sandboxes", "admin"},
		{readToken, "POST", "/v1/sandboxes/" + b + "/stop", "operate"},
		{readToken, "POST", "/v1/sandboxes/" + b + "/tokens", "operate"},
		{operateToken, "DELETE", "/v1/sandboxes/" + b, "admin"},
		{operateToken, "PATCH", "/v1/sandboxes/" + b, "admin"},
		{operateToken, "POST", "/v1/sandboxes/" + b + "/purge", "admin"},
		{globexToken, "POST", "/v1/sandboxes/" + b + "/wake", "operate"},
	}
	for _, f := range forbidden {
		var body any
		if f.method == "POST" && f.path == "/v1/sandboxes" {
			body = spec(newID(), nil)
		} else if f.method == "PATCH" {
			body = map[string]any{"access": "private"}
		}
		code, got := h.call(f.token, f.method, f.path, body)
		if code != 403 || !strings.Contains(got, `"forbidden"`) || !strings.Contains(got, "scope "+f.need) {
			t.Errorf("%s %s with a narrower token: %d %s, want 403 forbidden naming scope %s", f.method, f.path, code, got, f.need)
		}
	}
	if ids := h.listIDsAs(readToken); !contains(ids, a) || !contains(ids, b) {
		t.Errorf("read token lists %v, want both sandboxes", ids)
	}
	if code, body := h.call(operateToken, "POST", "/v1/sandboxes/"+b+"/stop", nil); code != 200 {
		t.Fatalf("operate token stopping: %d %s", code, body)
	}

	// acme never sees b.
	if ids := h.listIDsAs(acmeToken); len(ids) != 1 || ids[0] != a {
		t.Errorf("acme lists %v, want only %s", ids, a)
	}
	if ids := h.listIDsAs(globexToken); len(ids) != 1 || ids[0] != b {
		t.Errorf("globex lists %v, want only %s", ids, b)
	}
	for _, c := range [][2]string{{"GET", ""}, {"GET", "/history"}, {"POST", "/wake"}, {"POST", "/stop"}, {"POST", "/tokens"}, {"DELETE", ""}, {"POST", "/purge"}} {
		code, body := h.call(acmeToken, c[0], "/v1/sandboxes/"+b+c[1], nil)
		if code != 404 || !strings.Contains(body, "not_found") {
			t.Errorf("acme %s %s on globex's sandbox: %d %s, want 404 not_found", c[0], c[1], code, body)
		}
	}
	if code, body := h.call(acmeToken, "POST", "/v1/nodes/n1/drain", nil); code != 403 || !strings.Contains(body, "limited to its own") {
		t.Errorf("acme draining a node: %d %s, want 403", code, body)
	}
	// Events: b's transitions come first, then a's; the acme stream's
	// first event after its own creates must be a's, never b's.
	if code, body := h.call(gatewaytest.Token, "POST", "/v1/sandboxes/"+b+"/wake", nil); code != 200 {
		t.Fatalf("wake b: %d %s", code, body)
	}
	if code, body := h.call(acmeToken, "POST", "/v1/sandboxes/"+a+"/stop", nil); code != 200 {
		t.Fatalf("acme stopping its own: %d %s", code, body)
	}
	for {
		ev := acmeEvents.next(t, 20*time.Second)
		if ev.SandboxID != a {
			t.Fatalf("acme's event stream carried %s of sandbox %s", ev.Type, ev.SandboxID)
		}
		if ev.To == lifecycle.Stopped {
			break
		}
	}
	for {
		ev := globexEvents.next(t, 20*time.Second)
		if ev.SandboxID != b {
			t.Fatalf("globex's event stream carried %s of sandbox %s", ev.Type, ev.SandboxID)
		}
		if ev.To == lifecycle.Running && ev.Reason == "wake" {
			break
		}
	}

	for token, want := range map[string]string{readToken: `"scope":"read"`, operateToken: `"scope":"operate"`, acmeToken: `"labels":{"tenant":"acme"}`, gatewaytest.Token: `"scope":"admin"`} {
		if code, body := h.call(token, "GET", "/v1/whoami", nil); code != 200 || !strings.Contains(body, want) {
			t.Errorf("whoami: %d %s, want %s", code, body, want)
		}
	}
	if code, _ := h.call("not-a-token-0123456789", "GET", "/v1/whoami", nil); code != 401 {
		t.Errorf("whoami with a wrong token: %d, want 401", code)
	}
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// listIDsAs lists the sandbox ids a token sees.
func (h *harness) listIDsAs(token string) []string {
	h.T.Helper()
	code, body := h.call(token, "GET", "/v1/sandboxes", nil)
	var out struct {
		Sandboxes []struct {
			ID string `json:"id"`
		} `json:"sandboxes"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &out) != nil {
		h.T.Fatalf("list: %d %s", code, body)
	}
	var ids []string
	for _, s := range out.Sandboxes {
		ids = append(ids, s.ID)
	}
	return ids
}

// eventsAs opens /v1/events with a token.
func (h *harness) eventsAs(t *testing.T, token string) *sseClient {
	t.Helper()
	return h.eventsAsFrom(t, token, "", "")
}

// eventsAsFrom is eventsAs with a query and a Last-Event-ID to replay from
// ("" for none).
func (h *harness) eventsAsFrom(t *testing.T, token, query, lastID string) *sseClient {
	t.Helper()
	req, _ := http.NewRequest("GET", h.APIURL("/v1/events"+query), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("events: %v %v", err, resp)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &sseClient{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// TestDashboardScopes: in a real browser, a read token's dashboard lists
// the sandboxes with no action button, an operate token's has every button
// but Destroy, and a tenant's token (acme) lists its own sandbox only.
func TestDashboardScopes(t *testing.T) {
	h := scopedHarness(t)
	mine := newIDFor(h)
	if code, body := h.call(acmeToken, "POST", "/v1/sandboxes", map[string]any{"id": mine, "image": h.Image, "ports": []int{8080}}); code != 201 {
		t.Fatalf("acme create: %d %s", code, body)
	}
	theirs := h.Create(map[string]string{})
	srv := newDashboardServer(t, h, true)
	type facts struct {
		IDs     []string `json:"ids"`
		Buttons []string `json:"buttons"`
		Scope   string   `json:"scope"`
	}
	for _, tc := range []struct {
		token, scope string
		ids          []string
		buttons      string // the visible action buttons of a row, in order
	}{
		{readToken, "read token", []string{mine, theirs.ID}, ""},
		{operateToken, "operate token", []string{mine, theirs.ID}, "wake pause stop keepalive"},
		{acmeToken, "admin token · tenant=acme", []string{mine}, "wake pause stop keepalive destroy"},
	} {
		t.Run(tc.scope, func(t *testing.T) {
			ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
			gatewaytest.Browse(t, ctx, "signing in",
				signIn(srv.URL+"/", tc.token),
				chromedp.WaitVisible(rowSel(mine, `td.state[data-state="running"]`)),
			)
			var f facts
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				f = gatewaytest.Evaluate[facts](t, ctx, fmt.Sprintf(`(function () {
					var ids = [], buttons = [];
					document.querySelectorAll("tr[data-id]").forEach(function (tr) { ids.push(tr.getAttribute("data-id")); });
					document.querySelectorAll('tr[data-id=%q] button[data-action]').forEach(function (b) { if (!b.hidden) { buttons.push(b.getAttribute("data-action")); } });
					return { ids: ids.sort(), buttons: buttons, scope: document.getElementById("scope").textContent };
				})()`, mine))
				want := append([]string(nil), tc.ids...)
				sortStrings(want)
				return strings.Join(f.IDs, " ") == strings.Join(want, " ") && strings.Join(f.Buttons, " ") == tc.buttons && f.Scope == tc.scope,
					fmt.Sprintf("rows %v buttons %q scope %q; want rows %v buttons %q scope %q", f.IDs, f.Buttons, f.Scope, want, tc.buttons, tc.scope)
			})
		})
	}
}

func newIDFor(h *harness) string {
	id := testenv.UniqueID("g")
	h.RemoveOnCleanup(id)
	return id
}

func sortStrings(s []string) {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
}
