package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/moby/moby/client"

	swclient "github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// TestDashboardRowActionsFit: with a default-length (26 character) sandbox
// id, a row's actions are all on screen, not cut off or scrolled out of the
// table's card: on a 1280×800 laptop, a 1024×768 one and a 390 px wide phone
// the Destroy button lies fully inside the viewport, and it is what a tap at
// its centre hits.
func TestDashboardRowActionsFit(t *testing.T) {
	h := newHarness(t, "")
	id := (testenv.UniqueID("w") + strings.Repeat("0", 26))[:26]
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h.Docker.ContainerRemove(ctx, docker.ContainerName(id), client.ContainerRemoveOptions{Force: true})
		h.Docker.VolumeRemove(ctx, docker.VolumeName(id), client.VolumeRemoveOptions{Force: true})
	})
	var rec swclient.Sandbox
	// An app with a few ports (web, API, dev server, debugger): one preview
	// link each.
	body := map[string]any{"id": id, "image": h.Image, "ports": []int{8080, 3000, 5173, 9229}, "env": map[string]string{"EXTRA_PORTS": "3000,5173,9229"}}
	if status := h.API("POST", "/v1/sandboxes", body, &rec); status != http.StatusCreated {
		t.Fatalf("create: %d %+v", status, rec)
	}
	// A keepalive widens the "last active" cell as it would in use.
	if status := h.API("POST", "/v1/sandboxes/"+id+"/keepalive", map[string]any{"for": "30m"}, nil); status != http.StatusOK {
		t.Fatalf("keepalive: %d", status)
	}
	srv := newDashboardServer(t, h, true)
	ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
	gatewaytest.Browse(t, ctx, "signing in",
		chromedp.EmulateViewport(1280, 800),
		signIn(srv.URL+"/", gatewaytest.Token),
		chromedp.WaitVisible(rowSel(id, `td.state[data-state="running"]`)),
	)

	type fit struct {
		Left, Top, Right, Bottom float64
		VW, VH, ScrollWidth      float64
		Hit                      string
		IDRight, IDText          string
		Overflow                 float64
	}
	for _, vp := range []struct {
		name          string
		width, height int64
		phone         bool
	}{
		{"1280", 1280, 800, false},
		{"1024", 1024, 768, false},
		{"390", 390, 844, true},
	} {
		t.Run(vp.name, func(t *testing.T) {
			opts := []chromedp.EmulateViewportOption{}
			if vp.phone {
				opts = append(opts, chromedp.EmulateMobile, chromedp.EmulatePortrait)
			}
			gatewaytest.Browse(t, ctx, "opening at "+vp.name+" px",
				chromedp.EmulateViewport(vp.width, vp.height, opts...),
				chromedp.Reload(),
				chromedp.WaitVisible(rowSel(id, `td.state[data-state="running"]`)),
				chromedp.WaitVisible(rowSel(id, `td.active .keepalive`)),
			)
			// Only the page scrolls (vertically) to bring the row up, as a
			// person would; nothing scrolls sideways.
			got := gatewaytest.Evaluate[fit](t, ctx, fmt.Sprintf(`(function () {
				var tr = document.querySelector('tr[data-id=%q]'), b = tr.querySelector('button[data-action="destroy"]');
				var r = b.getBoundingClientRect();
				if (r.bottom > window.innerHeight) { window.scrollBy(0, r.bottom - window.innerHeight + 8); r = b.getBoundingClientRect(); }
				var hit = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
				var code = tr.querySelector("td.id code");
				return {
					Left: r.left, Top: r.top, Right: r.right, Bottom: r.bottom,
					VW: document.documentElement.clientWidth, VH: window.innerHeight,
					ScrollWidth: document.documentElement.scrollWidth,
					Hit: hit === b || b.contains(hit) ? "destroy" : (hit ? hit.tagName + "." + hit.className : "nothing"),
					IDRight: String(code.getBoundingClientRect().right), IDText: code.textContent,
					Overflow: document.querySelector(".table-wrap").scrollWidth - document.querySelector(".table-wrap").clientWidth
				};
			})()`, id))
			gatewaytest.Screenshot(t, ctx, "dashboard-actions-"+vp.name+".png")
			t.Logf("%s px: Destroy at [%.0f,%.0f]-[%.0f,%.0f] in a %.0f×%.0f viewport; id ends at x=%s; table overflows its card by %.0f px", vp.name, got.Left, got.Top, got.Right, got.Bottom, got.VW, got.VH, got.IDRight, got.Overflow)
			if got.Left < 0 || got.Top < 0 || got.Right > got.VW || got.Bottom > got.VH {
				t.Errorf("Destroy button at [%.1f,%.1f]-[%.1f,%.1f], not fully inside the %.0f×%.0f viewport", got.Left, got.Top, got.Right, got.Bottom, got.VW, got.VH)
			}
			if got.Overflow > 0 {
				t.Errorf("the table is %.0f px wider than its card: rows scroll out of it", got.Overflow)
			}
			if got.Hit != "destroy" {
				t.Errorf("a tap at the Destroy button's centre hits %s: the button is covered or clipped", got.Hit)
			}
			if got.ScrollWidth > got.VW {
				t.Errorf("page is %.0f px wide in a %.0f px viewport", got.ScrollWidth, got.VW)
			}
			if got.IDText != id {
				t.Errorf("id cell says %q, want %q", got.IDText, id)
			}
		})
	}
}
