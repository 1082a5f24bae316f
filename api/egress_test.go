package api_test

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/egress"
	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
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
	if c := chain(); strings.Contains(c, "\taccept") && !strings.Contains(c, "dport") {
		t.Errorf("a none sandbox's chain accepts:\n%s", c)
	}

	for _, tc := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"egress": map[string]any{"policy": "open"}}, `"open" is not public or none`},
		{map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"198.51.100.7:99999"}}}, `"198.51.100.7:99999"`},
		{map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"10.1.2.3:5432"}}}, "egress_allow_private"},
		{map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"169.254.169.254:80"}}}, "169.254.0.0/16"},
	} {
		var e client.ErrorResponse
		if status := h.API("PATCH", "/v1/sandboxes/"+id, tc.body, &e); status != http.StatusBadRequest || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("PATCH %v: %d %q, want 400 naming %s", tc.body, status, e.Error.Message, tc.want)
		}
	}
	status = h.API("PATCH", "/v1/sandboxes/"+id, map[string]any{"egress": map[string]any{"policy": "public", "allow": []string{"198.51.100.7:443", "203.0.113.0/24:53/udp"}}}, &rec)
	if status != 200 || rec.Egress.Policy != "public" || strings.Join(rec.Egress.Allow, " ") != "198.51.100.7:443/tcp 203.0.113.0/24:53/udp" {
		t.Fatalf("PATCH public: %d %+v", status, rec.Egress)
	}
	// In force when the PATCH answered: the kernel holds the new chain.
	c := chain()
	for _, want := range []string{"tcp dport 443 accept", "udp dport 53 accept", "@denied", "accept"} {
		if !strings.Contains(c, want) {
			t.Errorf("chain after PATCH lacks %q:\n%s", want, c)
		}
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
				chromedp.Navigate(srv.URL+"/"),
				chromedp.WaitVisible(chromedp.ID("token-form")),
				chromedp.SendKeys(chromedp.ID("token-input"), gatewaytest.Token),
				chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
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
