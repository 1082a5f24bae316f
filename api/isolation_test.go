package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/chromedp/chromedp"
	"github.com/moby/moby/client"

	swclient "github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// TestIsolationThroughTheAPI: on the real engine, a create's user,
// readonly_rootfs and cap_add come back in the record and are what the app
// sees from inside; the gateway's readonly_rootfs applies to creates that
// say nothing; a runtime the engine lacks is a 400 naming the runtimes it
// has, and a reload naming one is refused with the running config kept.
func TestIsolationThroughTheAPI(t *testing.T) {
	h := newHarness(t, "readonly_rootfs\nnofile 2048")
	create := func(body map[string]any) (int, swclient.Sandbox, string) {
		t.Helper()
		id := testenv.UniqueID("g")
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			h.Docker.ContainerRemove(ctx, docker.ContainerName(id), client.ContainerRemoveOptions{Force: true})
			h.Docker.VolumeRemove(ctx, docker.VolumeName(id), client.VolumeRemoveOptions{Force: true})
		})
		body["id"], body["image"], body["ports"] = id, h.Image, []int{8080}
		var rec swclient.Sandbox
		status := h.API("POST", "/v1/sandboxes", body, &rec)
		return status, rec, id
	}
	self := func(id string) map[string]any {
		t.Helper()
		resp, body := h.Preview("GET", h.Host(id, 8080), "/self", nil, gatewaytest.APIHeader())
		var v map[string]any
		if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &v) != nil {
			t.Fatalf("/self: %d %q", resp.StatusCode, body)
		}
		return v
	}

	status, rec, id := create(map[string]any{})
	if status != 201 || !rec.ReadonlyRootfs || rec.User != "" {
		t.Fatalf("create with the gateway's defaults: %d %+v, want a read-only root", status, rec)
	}
	if v := self(id); !strings.Contains(fmt.Sprint(v["root_write"]), "read-only") || v["nofile_soft"] != float64(2048) || v["uid"] != float64(0) {
		t.Fatalf("inside a default sandbox: %v, want a read-only root, nofile 2048, uid 0", v)
	}

	status, rec, id = create(map[string]any{"user": "1000:1000", "readonly_rootfs": false, "cap_add": []string{"net_raw"}})
	if status != 201 || rec.User != "1000:1000" || rec.ReadonlyRootfs || len(rec.CapAdd) != 1 || rec.CapAdd[0] != "NET_RAW" {
		t.Fatalf("create with its own isolation: %d %+v", status, rec)
	}
	if v := self(id); v["uid"] != float64(1000) || v["gid"] != float64(1000) || v["cap_eff"] != "0000000000000000" || v["root_write"] == "" {
		// A non-root user cannot write / even when it is writable: the
		// root directory is root's.
		t.Fatalf("inside a sandbox of user 1000: %v, want uid/gid 1000, no capabilities", v)
	}

	var apiErr struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if status := h.API("POST", "/v1/sandboxes", map[string]any{"id": testenv.UniqueID("g"), "image": h.Image, "ports": []int{8080}, "runtime": "sandwake-no-such-runtime"}, &apiErr); status != 400 || !strings.Contains(apiErr.Error.Message, "not installed") || !strings.Contains(apiErr.Error.Message, "runc") {
		t.Fatalf("create with a runtime the engine lacks: %d %+v, want 400 naming the installed runtimes", status, apiErr)
	}
	if status := h.API("POST", "/v1/sandboxes", map[string]any{"id": testenv.UniqueID("g"), "image": h.Image, "ports": []int{8080}, "cap_add": []string{"SYS_ADMIN"}}, &apiErr); status != 400 || !strings.Contains(apiErr.Error.Message, "cap_add") {
		t.Fatalf("create asking for SYS_ADMIN: %d %+v, want 400 naming cap_add", status, apiErr)
	}

	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(h.Caddyfile("runtime sandwake-no-such-runtime")), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err == nil || !strings.Contains(err.Error(), "sandwake-no-such-runtime") || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("reload naming a runtime the engine lacks: %v, want it refused", err)
	}
	if status, _, _ := create(map[string]any{}); status != 201 {
		t.Fatalf("create after the refused reload: %d, want the running config serving", status)
	}
}

// withoutSeccomp makes the Docker engine behind a proxy say of itself what
// an engine run with --seccomp-profile unconfined says: the rest of GET
// /info, and every other call, is the real engine's.
func withoutSeccomp(rp *httputil.ReverseProxy) {
	rp.ModifyResponse = func(res *http.Response) error {
		if res.Request.Method != http.MethodGet || !strings.HasSuffix(res.Request.URL.Path, "/info") || res.StatusCode != http.StatusOK {
			return nil
		}
		var info map[string]any
		err := json.NewDecoder(res.Body).Decode(&info)
		res.Body.Close()
		if err != nil {
			return fmt.Errorf("decoding docker info: %w", err)
		}
		opts, _ := info["SecurityOptions"].([]any)
		for i, o := range opts {
			if s, _ := o.(string); strings.HasPrefix(s, "name=seccomp") {
				opts[i] = "name=seccomp,profile=unconfined"
			}
		}
		body, err := json.Marshal(info)
		if err != nil {
			return err
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		res.ContentLength = int64(len(body))
		res.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
}

// TestDashboardShowsIsolation: in a real browser, the dashboard's banner
// carries readyz's isolation check when it says isolation is weakened (an
// engine that applies no seccomp profile), and says nothing of isolation on
// an engine with its seccomp profile; readyz stays ready either way.
func TestDashboardShowsIsolation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		seccomp  bool
		screenAs string
	}{
		{"engine with seccomp", true, "dashboard-isolation-ok.png"},
		{"engine without seccomp", false, "dashboard-isolation.png"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			extra := ""
			if !tc.seccomp {
				extra = "docker_host unix://" + gatewaytest.NewDockerAPIProxy(t, withoutSeccomp).Path
			}
			h := newHarness(t, extra)
			var ready struct {
				Ready  bool              `json:"ready"`
				Checks map[string]string `json:"checks"`
			}
			h.API("GET", "/v1/readyz", nil, &ready)
			check := ready.Checks["isolation"]
			weak, weakened := strings.CutPrefix(check, "ok, but ")
			if !ready.Ready || weakened == tc.seccomp || (weakened && !strings.Contains(weak, "no seccomp profile")) {
				t.Fatalf("readyz: ready %v, isolation %q", ready.Ready, check)
			}
			a := h.Create(nil)
			srv := newDashboardServer(t, h, true)
			ctx := gatewaytest.NewBrowser(t, chromedp.WindowSize(1280, 800))
			gatewaytest.Browse(t, ctx, "signing in",
				signIn(srv.URL+"/", gatewaytest.Token),
				chromedp.WaitVisible(rowSel(a.ID, `td.state[data-state="running"]`)),
			)
			type banner struct {
				Text  string `json:"text"`
				Shown bool   `json:"shown"`
			}
			read := func() banner {
				return gatewaytest.Evaluate[banner](t, ctx, `(function () {
					var w = document.getElementById("isolation-warning");
					return { text: w.textContent, shown: !w.hidden };
				})()`)
			}
			// The banner is filled from readyz once, after sign-in; it
			// says so whether or not it has anything to show.
			gatewaytest.Browse(t, ctx, "waiting for readyz to be read", chromedp.WaitReady(chromedp.CSS(`#isolation-warning[data-checked="true"]`)))
			b := read()
			hasLine := slices.Contains(strings.Split(b.Text, " · "), "Isolation: "+weak)
			switch {
			case weakened && (!b.Shown || !hasLine):
				t.Fatalf("banner %+v, want it shown with the line %q", b, "Isolation: "+weak)
			case !weakened && strings.Contains(b.Text, "Isolation"):
				t.Fatalf("banner %+v on an engine with seccomp (readyz: %q)", b, check)
			}
			gatewaytest.Screenshot(t, ctx, tc.screenAs)
		})
	}
}
