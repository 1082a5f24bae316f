package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandwake/sandwake/api"
	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// TestEgressThroughTheAPI drives egress policies through a real Caddy: the
// record shows them, bad entries are 400s naming the entry, a PATCH
// rewrites the sandbox's chain in the kernel before it answers, readyz
// has the egress check and the metrics the counters. (What the rules let
// through is tested against real hosts in package egress.)
func TestEgressThroughTheAPI(t *testing.T) {
	h := newHarness(t, "egress none")
	id := testenv.UniqueID("eg")
	var rec client.Sandbox
	status := h.API("POST", "/v1/sandboxes", map[string]any{"id": id, "image": h.Image, "ports": []int{8080}}, &rec)
	t.Cleanup(func() { h.API("DELETE", "/v1/sandboxes/"+id, nil, nil) })
	if status != http.StatusCreated {
		t.Fatalf("create: %d %+v", status, rec)
	}
	if rec.Egress == nil || rec.Egress.Policy != "none" || rec.Address == "" {
		t.Fatalf("record: egress %+v address %q, want the default none and an address", rec.Egress, rec.Address)
	}
	table := egress.TableName(docker.BridgeName("sandwake-" + h.Instance()))
	chain := func() string {
		out, err := exec.Command("nft", "list", "chain", "inet", table, "sb-"+id).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list chain: %v\n%s", err, out)
		}
		return string(out)
	}
	// The chain's last word: a rule that lets everything left through.
	opensAll := func(c string) bool {
		for l := range strings.Lines(c) {
			if w := strings.TrimSpace(l); w == "accept" || w == "goto allowed" {
				return true
			}
		}
		return false
	}
	if c := chain(); opensAll(c) {
		t.Errorf("a none sandbox's chain lets everything through:\n%s", c)
	}

	for _, tc := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"egress": map[string]any{"policy": "open"}}, `"open" is not public, none or learn`},
		{map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"198.51.100.7:99999"}}}, `"198.51.100.7:99999"`},
		{map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"10.1.2.3:5432"}}}, "egress_allow_private"},
		{map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"169.254.169.254:80"}}}, "169.254.0.0/16"},
	} {
		var e client.ErrorResponse
		if status := h.API("PATCH", "/v1/sandboxes/"+id, tc.body, &e); status != http.StatusBadRequest || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("PATCH %v: %d %q, want 400 naming %s", tc.body, status, e.Error.Message, tc.want)
		}
	}
	status = h.API("PATCH", "/v1/sandboxes/"+id, map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"198.51.100.7:443", "203.0.113.0/24:5353/udp"}}}, &rec)
	if status != 200 || rec.Egress.Policy != "public" || strings.Join(rec.Egress.Allow, " ") != "198.51.100.7:443/tcp 203.0.113.0/24:5353/udp" {
		t.Fatalf("PATCH public: %d %+v", status, rec.Egress)
	}
	// In force when the PATCH answered: the kernel holds the new chain.
	c := chain()
	for _, want := range []string{"tcp dport 443 goto allowed", "udp dport 5353 goto allowed", "@denied"} {
		if !strings.Contains(c, want) {
			t.Errorf("chain after PATCH lacks %q:\n%s", want, c)
		}
	}
	if !opensAll(c) {
		t.Errorf("a public sandbox's chain does not end letting the rest through:\n%s", c)
	}

	var hist struct {
		Events []struct {
			Type   string `json:"type"`
			Reason string `json:"reason"`
		} `json:"events"`
	}
	h.API("GET", "/v1/sandboxes/"+id+"/history", nil, &hist)
	if n := len(hist.Events); n == 0 || hist.Events[n-1].Type != "sandbox.egress_changed" || hist.Events[n-1].Reason != "public" {
		t.Errorf("history after the PATCH: %+v, want a sandbox.egress_changed event (public) last", hist.Events)
	}

	var ready struct {
		Checks map[string]string `json:"checks"`
	}
	h.API("GET", "/v1/readyz", nil, &ready)
	if ready.Checks["egress"] != "ok" {
		t.Errorf("readyz egress check: %q", ready.Checks["egress"])
	}
	resp, err := http.Get(h.APIURL("/metrics"))
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && (!strings.Contains(string(b), "caddy_sandwake_egress_denied_total") || !strings.Contains(string(b), "caddy_sandwake_egress_enforced 1")) {
			t.Errorf("metrics lack the egress series")
		}
	}
}

// TestEgressUnenforcedIsFlagged: with egress unenforced, sandboxes start
// without rules and readyz says so while staying ready.
func TestEgressUnenforcedIsFlagged(t *testing.T) {
	h := newHarness(t, "egress unenforced")
	var ready struct {
		Ready  bool              `json:"ready"`
		Checks map[string]string `json:"checks"`
	}
	h.API("GET", "/v1/readyz", nil, &ready)
	if !ready.Ready || !strings.Contains(ready.Checks["egress"], "unenforced") {
		t.Fatalf("readyz with egress unenforced: %+v", ready)
	}
	rec := h.Create(nil)
	out, _ := exec.Command("nft", "list", "chains", "inet").CombinedOutput()
	if strings.Contains(string(out), "sb-"+rec.ID) {
		t.Errorf("rules installed although egress is unenforced")
	}
}

// TestDashboardShowsEgress: in a real browser, each row says its sandbox's
// egress policy, and with egress unenforced a banner says so.
func TestDashboardShowsEgress(t *testing.T) {
	for _, tc := range []struct {
		extra, banner, row string
	}{
		{"", "", "egress public"},
		{"egress unenforced", "Egress unenforced", "egress public"},
	} {
		t.Run(tc.extra, func(t *testing.T) {
			h := newHarness(t, tc.extra)
			a := h.Create(nil)
			srv := newDashboardServer(t, h, true)
			ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
			gatewaytest.Browse(t, ctx, "signing in",
				signIn(srv.URL+"/", gatewaytest.Token),
				chromedp.WaitVisible(rowSel(a.ID, `td.state[data-state="running"]`)),
			)
			type facts struct {
				Row    string `json:"row"`
				Banner string `json:"banner"`
				Shown  bool   `json:"shown"`
			}
			var f facts
			testenv.Eventually(t, 10*time.Second, func() (bool, string) {
				f = gatewaytest.Evaluate[facts](t, ctx, fmt.Sprintf(`(function () {
					var tr = document.querySelector('tr[data-id=%q]'), w = document.getElementById("isolation-warning");
					return { row: tr.querySelector(".sub.egress").textContent, banner: w.textContent, shown: !w.hidden };
				})()`, a.ID))
				return strings.HasPrefix(f.Row, tc.row) && (tc.banner == "") == !f.Shown, fmt.Sprintf("row %q, banner %q shown %v", f.Row, f.Banner, f.Shown)
			})
			if tc.banner != "" && !strings.HasPrefix(f.Banner, tc.banner) {
				t.Errorf("banner %q, want %q…", f.Banner, tc.banner)
			}
			gatewaytest.Screenshot(t, ctx, "dashboard-egress.png")
		})
	}
}

// TestEgressLogAndLock: through a real Caddy and Docker, a create and a
// PATCH carry deny lists of names and addresses and an activity, bad ones
// are 400s naming the entry; GET /v1/sandboxes/{id}/egress answers a
// sandbox's log (empty lists, not null, for one that did nothing) with the
// learned list while it learns; POST …/egress/lock turns a learning
// sandbox into none with what it learned, and is a 409 for one that is not
// learning. Both routes answer 404 for an unknown sandbox and for another
// tenant's, and the lock needs an admin token. (What the log holds is the
// firewall's, tested in package egress.)
func TestEgressLogAndLock(t *testing.T) {
	h := scopedHarness(t)
	spec := func(id string, extra map[string]any) map[string]any {
		body := map[string]any{"id": id, "image": h.Image, "ports": []int{8080}}
		for k, v := range extra {
			body[k] = v
		}
		return body
	}
	newID := func() string {
		id := testenv.UniqueID("el")
		h.RemoveOnCleanup(id)
		return id
	}

	for _, tc := range []struct {
		extra map[string]any
		want  string
	}{
		{map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"-bad-.example.com"}}}, `egress.allow: "-bad-.example.com"`},
		{map[string]any{"egress": map[string]any{"policy": "public", "deny": []string{"pastebin.com", "no..dots.example"}}}, `egress.deny: "no..dots.example"`},
		{map[string]any{"egress": map[string]any{"policy": "none", "deny": []string{"pastebin.com"}}}, "egress.deny: a none policy opens nothing to deny"},
		{map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"dns.example.com:53/udp"}}}, "opens a DNS port"},
		{map[string]any{"activity": "sometimes"}, `activity: "sometimes" is not inbound or any`},
	} {
		var e client.ErrorResponse
		if status := h.API("POST", "/v1/sandboxes", spec(newID(), tc.extra), &e); status != http.StatusBadRequest || e.Error.Code != "invalid" || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("create with %v: %d %+v, want 400 naming %s", tc.extra, status, e.Error, tc.want)
		}
	}

	// A learning sandbox of tenant acme, with a deny list and activity any.
	a := newID()
	var rec client.Sandbox
	if code, body := h.call(acmeToken, "POST", "/v1/sandboxes", spec(a, map[string]any{
		"egress":   map[string]any{"policy": "learn", "allow": []string{"Registry.NPMjs.org."}, "deny": []string{"pastebin.com", "203.0.113.0/24"}},
		"activity": "any",
	})); code != http.StatusCreated || json.Unmarshal([]byte(body), &rec) != nil {
		t.Fatalf("create learning: %d %s", code, body)
	}
	if rec.Egress == nil || rec.Egress.Policy != "learn" || strings.Join(rec.Egress.Allow, " ") != "registry.npmjs.org" ||
		strings.Join(rec.Egress.Deny, " ") != "pastebin.com 203.0.113.0/24" || rec.Activity != "any" {
		t.Fatalf("record of the learning sandbox: egress %+v activity %q", rec.Egress, rec.Activity)
	}
	var got client.Sandbox
	if h.API("GET", "/v1/sandboxes/"+a, nil, &got); got.Activity != "any" || got.Egress == nil || len(got.Egress.Deny) != 2 {
		t.Fatalf("GET of the learning sandbox: egress %+v activity %q", got.Egress, got.Activity)
	}
	// Another tenant's sandbox, under public.
	b := newID()
	if code, body := h.call(gatewaytest.Token, "POST", "/v1/sandboxes", spec(b, map[string]any{"labels": map[string]string{"tenant": "globex"}})); code != http.StatusCreated {
		t.Fatalf("create globex: %d %s", code, body)
	}

	code, body := h.call(acmeToken, "GET", "/v1/sandboxes/"+a+"/egress", nil)
	var l map[string]json.RawMessage
	if code != http.StatusOK || json.Unmarshal([]byte(body), &l) != nil {
		t.Fatalf("GET egress of a learning sandbox: %d %s", code, body)
	}
	if string(l["id"]) != `"`+a+`"` || string(l["policy"]) != `"learn"` || string(l["decisions"]) != "[]" || string(l["lookups"]) != "[]" || string(l["learned"]) != "[]" {
		t.Errorf("GET egress of a learning sandbox that did nothing: %s, want its id, policy learn and empty decisions, lookups and learned", body)
	}
	if code, body := h.call(readToken, "GET", "/v1/sandboxes/"+b+"/egress", nil); code != http.StatusOK || strings.Contains(body, `"learned"`) || !strings.Contains(body, `"policy":"public"`) {
		t.Errorf("GET egress of a public sandbox with a read token: %d %s, want 200 without learned", code, body)
	}

	missing := testenv.UniqueID("nx")
	for _, c := range []struct {
		token, method, path string
		status              int
		want                string
	}{
		{gatewaytest.Token, "GET", "/v1/sandboxes/" + missing + "/egress", 404, "not_found"},
		{gatewaytest.Token, "POST", "/v1/sandboxes/" + missing + "/egress/lock", 404, "not_found"},
		{gatewaytest.Token, "GET", "/v1/sandboxes/Not_An_ID/egress", 404, "not_found"},
		// Another tenant's sandbox is an unknown one.
		{acmeToken, "GET", "/v1/sandboxes/" + b + "/egress", 404, "not_found"},
		{acmeToken, "POST", "/v1/sandboxes/" + b + "/egress/lock", 404, "not_found"},
		{globexToken, "GET", "/v1/sandboxes/" + a + "/egress", 404, "not_found"},
		// The lock changes the policy: admin, as PATCH.
		{readToken, "POST", "/v1/sandboxes/" + a + "/egress/lock", 403, "scope admin"},
		{operateToken, "POST", "/v1/sandboxes/" + a + "/egress/lock", 403, "scope admin"},
		{globexToken, "POST", "/v1/sandboxes/" + b + "/egress/lock", 403, "scope admin"},
		// Not learning.
		{gatewaytest.Token, "POST", "/v1/sandboxes/" + b + "/egress/lock", 409, "is not learning"},
	} {
		if code, body := h.call(c.token, c.method, c.path, nil); code != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s, want %d naming %s", c.method, c.path, code, body, c.status, c.want)
		}
	}

	// Lock: what it learned (nothing) becomes its allow list under none.
	code, body = h.call(acmeToken, "POST", "/v1/sandboxes/"+a+"/egress/lock", nil)
	rec = client.Sandbox{}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &rec) != nil || rec.ID != a || rec.Egress == nil || rec.Egress.Policy != "none" || len(rec.Egress.Allow) != 0 || len(rec.Egress.Deny) != 0 {
		t.Fatalf("lock: %d %s, want the sandbox under none with an empty allow list", code, body)
	}
	if code, body := h.call(acmeToken, "POST", "/v1/sandboxes/"+a+"/egress/lock", nil); code != http.StatusConflict || !strings.Contains(body, `"conflict"`) || !strings.Contains(body, "is not learning") {
		t.Errorf("lock again: %d %s, want 409 saying the sandbox is not learning", code, body)
	}
	if code, body := h.call(acmeToken, "GET", "/v1/sandboxes/"+a+"/egress", nil); code != http.StatusOK || strings.Contains(body, `"learned"`) || !strings.Contains(body, `"policy":"none"`) {
		t.Errorf("GET egress after the lock: %d %s, want policy none without learned", code, body)
	}

	// PATCH carries deny; a bad entry is a 400 naming it, and a PATCH
	// without deny empties it.
	var e client.ErrorResponse
	if status := h.API("PATCH", "/v1/sandboxes/"+b, map[string]any{"egress": map[string]any{"policy": "public", "deny": []string{"*.pastebin.com", "bad name.com"}}}, &e); status != http.StatusBadRequest || !strings.Contains(e.Error.Message, `"bad name.com"`) {
		t.Errorf("PATCH with a bad deny entry: %d %+v, want 400 naming it", status, e.Error)
	}
	rec = client.Sandbox{}
	if status := h.API("PATCH", "/v1/sandboxes/"+b, map[string]any{"egress": map[string]any{"policy": "learn", "deny": []string{"*.Pastebin.com", "198.51.100.9:25"}}}, &rec); status != http.StatusOK ||
		rec.Egress == nil || rec.Egress.Policy != "learn" || strings.Join(rec.Egress.Deny, " ") != "*.pastebin.com 198.51.100.9:25" {
		t.Fatalf("PATCH deny: %d %+v", status, rec.Egress)
	}
	rec = client.Sandbox{}
	if status := h.API("PATCH", "/v1/sandboxes/"+b, map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"api.example.com:443"}}}, &rec); status != http.StatusOK ||
		rec.Egress == nil || len(rec.Egress.Deny) != 0 || strings.Join(rec.Egress.Allow, " ") != "api.example.com:443" {
		t.Fatalf("PATCH without deny: %d %+v, want the deny list emptied", status, rec.Egress)
	}
}

// TestDashboardEgressLog: in a real browser, a row's egress line opens the
// sandbox's egress log; each denied name has an Allow button that adds it
// to the sandbox's allow list through the real API, and a learning
// sandbox has a Lock button that locks it. The log the page is given holds
// made-up traffic (the firewall's own log is tested in package egress);
// every other call goes to the real API.
func TestDashboardEgressLog(t *testing.T) {
	h := newHarness(t, "")
	status, a := h.CreateWith(map[string]any{"egress": map[string]any{"policy": "learn", "allow": []string{"registry.npmjs.org"}}})
	if status != http.StatusCreated {
		t.Fatalf("create: %d", status)
	}
	target, err := url.Parse(h.APIURL(""))
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }, FlushInterval: -1}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", api.ServeDashboard)
	mux.Handle("/v1/", proxy)
	mux.HandleFunc("GET /v1/sandboxes/{id}/egress", func(w http.ResponseWriter, r *http.Request) {
		// The real answer (id, policy, learned), with traffic added.
		rec := httptest.NewRecorder()
		proxy.ServeHTTP(rec, r)
		var l client.EgressLog
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &l) != nil {
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
			return
		}
		now := time.Now()
		l.Lookups = []client.EgressLookup{
			{Name: "pastebin.com", Addrs: []string{"203.0.113.9"}, Allowed: false, Count: 3, Last: now},
			{Name: "registry.npmjs.org", Addrs: []string{"104.16.1.34"}, Allowed: true, Count: 7, Last: now},
		}
		l.Decisions = []client.EgressDecision{
			{First: now, Last: now, Addr: "203.0.113.7", Port: 443, Proto: "tcp", Name: "evil.example", Allowed: false, Count: 2},
			{First: now, Last: now, Addr: "104.16.1.34", Port: 443, Proto: "tcp", Name: "registry.npmjs.org", Allowed: true, Count: 4},
		}
		web.WriteJSON(w, http.StatusOK, l)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
	dlg := handleDialogs(t, ctx)
	gatewaytest.Browse(t, ctx, "opening the egress log",
		chromedp.EmulateViewport(1280, 800),
		signIn(srv.URL+"/", gatewaytest.Token),
		chromedp.WaitVisible(rowSel(a.ID, `td.state[data-state="running"]`)),
		chromedp.Click(rowSel(a.ID, `.sub.egress button[data-egress]`)),
		chromedp.WaitVisible(chromedp.CSS(`#egress-lookups tr[data-name="pastebin.com"] button[data-allow]`)),
	)
	gatewaytest.Screenshot(t, ctx, "dashboard-egress-log.png")
	type facts struct {
		Panel   string   `json:"panel"`
		Allows  []string `json:"allows"`
		Lock    bool     `json:"lock"`
		Learned string   `json:"learned"`
		Dests   []string `json:"dests"`
		CSP     string   `json:"csp"`
	}
	f := gatewaytest.Evaluate[facts](t, ctx, `(function () {
		var p = document.getElementById("egress-panel");
		return {
			panel: p.getAttribute("data-id"),
			allows: Array.prototype.map.call(p.querySelectorAll("button[data-allow]"), function (b) { return b.getAttribute("data-allow"); }),
			lock: !document.getElementById("egress-lock").hidden,
			learned: document.getElementById("egress-learned").textContent,
			dests: Array.prototype.map.call(p.querySelectorAll("#egress-decisions tr[data-destination]"), function (tr) { return tr.getAttribute("data-destination") + " " + tr.querySelector(".verdict").textContent; }),
			csp: document.documentElement.getAttribute("data-csp-violations") || ""
		};
	})()`)
	if f.Panel != a.ID || strings.Join(f.Allows, " ") != "pastebin.com evil.example" || !f.Lock || !strings.Contains(f.Learned, "Locking makes the allow list") ||
		strings.Join(f.Dests, ", ") != "203.0.113.7:443/tcp denied, 104.16.1.34:443/tcp allowed" || f.CSP != "" {
		t.Fatalf("egress log panel: %+v, want Allow on the two denied names, a Lock button, the learned list and both connections", f)
	}

	gatewaytest.Browse(t, ctx, "allowing a denied name",
		chromedp.Click(chromedp.CSS(`#egress-lookups tr[data-name="pastebin.com"] button[data-allow]`)),
		chromedp.WaitVisible(chromedp.CSS(`#message[data-kind="info"]`)),
	)
	var rec client.Sandbox
	if h.API("GET", "/v1/sandboxes/"+a.ID, nil, &rec); rec.Egress == nil || rec.Egress.Policy != "learn" || strings.Join(rec.Egress.Allow, " ") != "registry.npmjs.org pastebin.com" {
		t.Fatalf("after Allow: egress %+v, want pastebin.com added to the allow list under learn", rec.Egress)
	}

	gatewaytest.Browse(t, ctx, "locking", chromedp.Click(chromedp.ID("egress-lock")))
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		row := gatewaytest.Evaluate[string](t, ctx, fmt.Sprintf(`document.querySelector('tr[data-id=%q] .sub.egress').textContent`, a.ID))
		return strings.HasPrefix(row, "egress none"), "row egress " + row
	})
	if h.API("GET", "/v1/sandboxes/"+a.ID, nil, &rec); rec.Egress == nil || rec.Egress.Policy != "none" {
		t.Fatalf("after Lock: egress %+v, want none", rec.Egress)
	}
	if got := fmt.Sprint(dlg.seen()); got != "[confirm]" {
		t.Errorf("dialogs %s, want the lock's [confirm]", got)
	}
	// The panel reloads on the egress_changed event (at most once a
	// second), after the row.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		shown := gatewaytest.Evaluate[bool](t, ctx, `!document.getElementById("egress-lock").hidden`)
		return !shown, "the Lock button is still shown once the sandbox is under none"
	})
}
