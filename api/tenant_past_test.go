package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// Tokens of TestTenantOwnsItsIDsPast: two tenants, both of scope admin.
const (
	tenantAToken = "tenant-a-token-0123456789"
	tenantBToken = "tenant-b-token-0123456789"
)

func tenantsHarness(t *testing.T) *harness {
	return newHarnessWithCaddyfile(t, func(h *harness) string {
		return strings.Replace(h.Caddyfile(""), "token "+gatewaytest.Token+"\n", fmt.Sprintf(`token %s
		token %s {
			scope admin
			labels tenant=acme
		}
		token %s {
			scope admin
			labels tenant=beta
		}
`, gatewaytest.Token, tenantAToken, tenantBToken), 1)
	})
}

// errorOf is the error code and message of an API error body.
func errorOf(t *testing.T, body string) (code, msg string) {
	t.Helper()
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an API error: %s", body)
	}
	return e.Error.Code, e.Error.Message
}

// TestTenantOwnsItsIDsPast reproduces security III's first finding on the
// real engine: acme's sandbox x writes a file and is destroyed (its volume
// kept); beta's create of x must be refused exactly as an id beta cannot
// see is refused, mount nothing, and show beta none of acme's history or
// events. acme may take its files back, and purge them, after which beta
// gets x with an empty workspace and a history of its own (its replay of
// the event log from the start too), while acme's event stream, open all
// along, never carries beta's events of x.
func TestTenantOwnsItsIDsPast(t *testing.T) {
	h := tenantsHarness(t)
	x := testenv.UniqueID("x")
	h.RemoveOnCleanup(x)
	spec := func(id string) map[string]any {
		return map[string]any{"id": id, "image": h.Image, "ports": []int{8080}, "memory_mb": 32}
	}
	acmeEvents := h.eventsAs(t, tenantAToken)

	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes", spec(x)); code != 201 {
		t.Fatalf("acme creates %s: %d %s", x, code, body)
	}
	resp, body := h.Preview("PUT", h.Host(x, 8080), "/files/secret.txt", strings.NewReader("acme's secret"), nil)
	if resp.StatusCode != 201 {
		t.Fatalf("writing acme's file: %d %s", resp.StatusCode, body)
	}
	if code, body := h.call(tenantAToken, "DELETE", "/v1/sandboxes/"+x, nil); code != 204 {
		t.Fatalf("acme destroys %s: %d %s", x, code, body)
	}
	vol, err := h.Docker.VolumeInspect(context.Background(), docker.VolumeName(x), client.VolumeInspectOptions{})
	if err != nil {
		t.Fatalf("the kept volume: %v", err)
	}
	if vol.Volume.Labels[docker.LabelOwnerPrefix+"tenant"] != "acme" || vol.Volume.Labels[docker.LabelOwnerIncarnation] == "" {
		t.Errorf("the kept volume does not record its owner: %v", vol.Volume.Labels)
	}

	// An id beta cannot see, taken: the answer beta must get for x too.
	y := testenv.UniqueID("y")
	h.RemoveOnCleanup(y)
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes", spec(y)); code != 201 {
		t.Fatalf("acme creates %s: %d %s", y, code, body)
	}
	takenCode, takenBody := h.call(tenantBToken, "POST", "/v1/sandboxes", spec(y))
	wantCode, wantMsg := errorOf(t, takenBody)
	code, body := h.call(tenantBToken, "POST", "/v1/sandboxes", spec(x))
	gotCode, gotMsg := errorOf(t, body)
	if code != takenCode || gotCode != wantCode || gotMsg != strings.ReplaceAll(wantMsg, y, x) {
		t.Fatalf("beta creating acme's destroyed %s: %d %s; want what an invisible taken id gets: %d %s", x, code, body, takenCode, takenBody)
	}
	if _, err := h.Docker.ContainerInspect(context.Background(), docker.ContainerName(x), client.ContainerInspectOptions{}); err == nil {
		t.Fatalf("beta's refused create made a container mounting acme's volume")
	}
	for _, path := range []string{"/v1/sandboxes/" + x + "/history", "/v1/sandboxes/" + x} {
		if code, body := h.call(tenantBToken, "GET", path, nil); code != 404 {
			t.Errorf("beta GET %s: %d %s, want 404", path, code, body)
		}
	}
	if code, body := h.call(tenantBToken, "POST", "/v1/sandboxes/"+x+"/purge", nil); code != 404 {
		t.Errorf("beta purging acme's kept volume: %d %s, want 404", code, body)
	}

	// acme takes its files back: its own kept volume.
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes", spec(x)); code != 201 {
		t.Fatalf("acme re-creates %s: %d %s", x, code, body)
	}
	if resp, body := h.Preview("GET", h.Host(x, 8080), "/files/secret.txt", nil, nil); resp.StatusCode != 200 || body != "acme's secret" {
		t.Fatalf("acme's re-created %s reads its file: %d %q", x, resp.StatusCode, body)
	}
	// acme sees the history of its destroyed sandbox, then purges it.
	if code, body := h.call(tenantAToken, "DELETE", "/v1/sandboxes/"+x, nil); code != 204 {
		t.Fatalf("acme destroys %s again: %d %s", x, code, body)
	}
	if code, body := h.call(tenantAToken, "GET", "/v1/sandboxes/"+x+"/history", nil); code != 200 || !strings.Contains(body, `"tenant":"acme"`) {
		t.Errorf("acme reading its destroyed sandbox's history: %d %s", code, body)
	}
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes/"+x+"/purge", nil); code != 200 {
		t.Fatalf("acme purging its own kept volume: %d %s", code, body)
	}

	// Now x is free: beta gets it, empty, with a history of its own.
	if code, body := h.call(tenantBToken, "POST", "/v1/sandboxes", spec(x)); code != 201 {
		t.Fatalf("beta creates the purged %s: %d %s", x, code, body)
	}
	if resp, body := h.Preview("GET", h.Host(x, 8080), "/files/secret.txt", nil, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("beta's %s reads acme's purged file: %d %q", x, resp.StatusCode, body)
	}
	code, body = h.call(tenantBToken, "GET", "/v1/sandboxes/"+x+"/history", nil)
	var hist struct {
		Events []lifecycle.Event `json:"events"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &hist) != nil || len(hist.Events) == 0 {
		t.Fatalf("beta's history of %s: %d %s", x, code, body)
	}
	for _, ev := range hist.Events {
		if ev.Labels["tenant"] != "beta" {
			t.Errorf("beta's history of %s carries another incarnation's event: %+v", x, ev)
		}
	}
	if code, body := h.call(tenantAToken, "GET", "/v1/sandboxes/"+x+"/history", nil); code != 404 {
		t.Errorf("acme reading beta's %s's history: %d %s, want 404", x, code, body)
	}
	if code, body := h.call(tenantBToken, "POST", "/v1/sandboxes/"+x+"/stop", nil); code != 200 {
		t.Fatalf("beta stops %s: %d %s", x, code, body)
	}
	// beta replaying the whole log of x (Last-Event-ID 0) gets its own
	// events of x, up to that stop, and none of acme's before them.
	replay := h.eventsAsFrom(t, tenantBToken, "?sandbox="+x, "0")
	for {
		ev := replay.next(t, 30*time.Second)
		if ev.Labels["tenant"] != "beta" {
			t.Fatalf("beta's replay of %s carried another incarnation's event: %+v", x, ev)
		}
		if ev.To == lifecycle.Stopped {
			break
		}
	}
	// A marker of acme's own after beta's events: acme's stream, open
	// since before the re-create, must reach it without one of beta's.
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes/"+y+"/stop", nil); code != 200 {
		t.Fatalf("acme stops %s: %d %s", y, code, body)
	}
	for {
		ev := acmeEvents.next(t, 30*time.Second)
		if ev.Labels["tenant"] != "acme" {
			t.Fatalf("acme's event stream carried another tenant's event: %+v", ev)
		}
		if ev.SandboxID == y && ev.To == lifecycle.Stopped {
			break
		}
	}
}

// TestTenantPoolClaims: a tenant's token sees templates without the
// gateway-wide pool figures; a sandbox it claims from the pool owns the
// claimed volume (the pool made it unlabelled), so after a destroy the
// tenant may purge it and another tenant may not take the id.
func TestTenantPoolClaims(t *testing.T) {
	h := newHarnessWithCaddyfile(t, func(h *harness) string {
		cf := strings.Replace(h.Caddyfile(fmt.Sprintf("template web {\n\t\t\timage %s\n\t\t\tports 8080\n\t\t\tmemory_mb 32\n\t\t\tpool {\n\t\t\t\tmin_idle 1\n\t\t\t}\n\t\t}", h.Image)),
			"token "+gatewaytest.Token+"\n", fmt.Sprintf("token %s\n\t\ttoken %s {\n\t\t\tlabels tenant=acme\n\t\t}\n\t\ttoken %s {\n\t\t\tlabels tenant=beta\n\t\t}\n", gatewaytest.Token, tenantAToken, tenantBToken), 1)
		return cf
	})
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		var list struct {
			Templates []struct {
				Pool *struct {
					Idle int `json:"idle"`
				} `json:"pool"`
			} `json:"templates"`
		}
		h.API("GET", "/v1/templates", nil, &list)
		return len(list.Templates) == 1 && list.Templates[0].Pool != nil && list.Templates[0].Pool.Idle == 1, fmt.Sprintf("%+v", list)
	})
	if code, body := h.call(tenantAToken, "GET", "/v1/templates", nil); code != 200 || !strings.Contains(body, `"name":"web"`) || strings.Contains(body, `"pool"`) {
		t.Fatalf("templates for a tenant: %d %s, want the template without pool figures", code, body)
	}
	code, body := h.call(tenantAToken, "POST", "/v1/sandboxes", map[string]any{"template": "web"})
	var rec struct {
		ID   string `json:"id"`
		Pool struct {
			Hit bool `json:"hit"`
		} `json:"pool"`
	}
	if code != 201 || json.Unmarshal([]byte(body), &rec) != nil || !rec.Pool.Hit {
		t.Fatalf("acme's create from the pool: %d %s, want a hit", code, body)
	}
	h.RemoveOnCleanup(rec.ID)
	if code, body := h.call(tenantAToken, "DELETE", "/v1/sandboxes/"+rec.ID, nil); code != 204 {
		t.Fatalf("destroy: %d %s", code, body)
	}
	if code, body := h.call(tenantBToken, "POST", "/v1/sandboxes", map[string]any{"id": rec.ID, "template": "web"}); code != 409 {
		t.Fatalf("beta taking acme's claimed id: %d %s, want 409", code, body)
	}
	if code, body := h.call(tenantBToken, "POST", "/v1/sandboxes/"+rec.ID+"/purge", nil); code != 404 {
		t.Fatalf("beta purging acme's claimed volume: %d %s, want 404", code, body)
	}
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes/"+rec.ID+"/purge", nil); code != 200 {
		t.Fatalf("acme purging its claimed volume: %d %s", code, body)
	}
}

// TestTenantOwnsItsServicesPast: a sandbox's services keep volumes of their
// own, which must stay their tenant's as the app's does. acme's x with a
// service db is destroyed (every volume kept); its app's volume then goes
// (as a purge cut short between its volumes would leave it): beta's create
// of x with the same service must be refused, mount nothing and leave the
// service's volume acme's. A purge removes the services' volumes before the
// app's, so that its app volume, which a create asks first, goes last.
func TestTenantOwnsItsServicesPast(t *testing.T) {
	h := tenantsHarness(t)
	ctx := context.Background()
	x := testenv.UniqueID("x")
	h.RemoveOnCleanup(x)
	spec := map[string]any{"id": x, "image": h.Image, "ports": []int{8080}, "memory_mb": 32,
		"services": map[string]any{"db": map[string]any{"image": h.Image, "memory_mb": 32, "ready": "tcp:5432",
			"env": map[string]string{"PORT": "5432", "LISTEN_HOST": "127.0.0.1"}}}}
	dbVolume := docker.MemberVolumeName(x, "db")

	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes", spec); code != 201 {
		t.Fatalf("acme creates %s with a service: %d %s", x, code, body)
	}
	if code, body := h.call(tenantAToken, "DELETE", "/v1/sandboxes/"+x, nil); code != 204 {
		t.Fatalf("acme destroys %s: %d %s", x, code, body)
	}
	vol, err := h.Docker.VolumeInspect(ctx, dbVolume, client.VolumeInspectOptions{})
	if err != nil {
		t.Fatalf("the service's kept volume: %v", err)
	}
	if vol.Volume.Labels[docker.LabelOwnerPrefix+"tenant"] != "acme" || vol.Volume.Labels[docker.LabelOwnerIncarnation] == "" {
		t.Fatalf("the service's kept volume does not record its owner: %v", vol.Volume.Labels)
	}

	// The app's volume gone, the service's left: nothing of the app's
	// says whose x was.
	if _, err := h.Docker.VolumeRemove(ctx, docker.VolumeName(x), client.VolumeRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	// beta's spec adds a service aux, made (volume and all) before db's
	// kept volume refuses the create: what the refused create made goes.
	betaSpec := maps.Clone(spec)
	betaSpec["services"] = map[string]any{"db": spec["services"].(map[string]any)["db"], "aux": map[string]any{"image": h.Image, "memory_mb": 32}}
	code, body := h.call(tenantBToken, "POST", "/v1/sandboxes", betaSpec)
	if code != http.StatusConflict {
		t.Fatalf("beta creating %s over acme's service volume: %d %s, want 409", x, code, body)
	}
	if _, err := h.Docker.VolumeInspect(ctx, docker.MemberVolumeName(x, "aux"), client.VolumeInspectOptions{}); err == nil {
		t.Errorf("beta's refused create left the volume it made for its service aux")
	}
	for _, name := range []string{docker.ContainerName(x), docker.MemberName(x, "db"), docker.MemberName(x, "aux"), docker.MemberName(x, "net")} {
		if _, err := h.Docker.ContainerInspect(ctx, name, client.ContainerInspectOptions{}); err == nil {
			t.Errorf("beta's refused create left container %s", name)
		}
	}
	if vol, err := h.Docker.VolumeInspect(ctx, dbVolume, client.VolumeInspectOptions{}); err != nil || vol.Volume.Labels[docker.LabelOwnerPrefix+"tenant"] != "acme" {
		t.Errorf("after beta's refused create the service's volume is %v, %v; want acme's, kept", vol.Volume.Labels, err)
	}
	if code, body := h.call(tenantBToken, "GET", "/v1/sandboxes/"+x, nil); code != 404 {
		t.Errorf("beta's refused create left a record: %d %s", code, body)
	}

	// A purge takes the services' volumes first and the app's last.
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes", spec); code != 201 {
		t.Fatalf("acme re-creates %s: %d %s", x, code, body)
	}
	if code, body := h.call(tenantAToken, "DELETE", "/v1/sandboxes/"+x, nil); code != 204 {
		t.Fatalf("acme destroys %s again: %d %s", x, code, body)
	}
	since := time.Now()
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes/"+x+"/purge", nil); code != 200 {
		t.Fatalf("acme purges %s: %d %s", x, code, body)
	}
	var order []string
	res := h.Docker.Events(ctx, client.EventsListOptions{Since: since.Format(time.RFC3339Nano), Until: time.Now().Add(time.Second).Format(time.RFC3339Nano),
		Filters: client.Filters{}.Add("type", "volume").Add("event", "destroy")})
	for {
		select {
		case ev := <-res.Messages:
			if n := ev.Actor.ID; n == dbVolume || n == docker.VolumeName(x) {
				order = append(order, n)
			}
			continue
		case err := <-res.Err:
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("reading the engine's events: %v", err)
			}
		}
		break
	}
	if want := []string{dbVolume, docker.VolumeName(x)}; !slices.Equal(order, want) {
		t.Errorf("a purge removed %v, want %v (the app's volume last)", order, want)
	}

	// A purge cut short after the app's volume left the service's: a
	// purge still removes it.
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes", spec); code != 201 {
		t.Fatalf("acme creates %s a third time: %d %s", x, code, body)
	}
	if code, body := h.call(tenantAToken, "DELETE", "/v1/sandboxes/"+x, nil); code != 204 {
		t.Fatalf("acme destroys %s a third time: %d %s", x, code, body)
	}
	if _, err := h.Docker.VolumeRemove(ctx, docker.VolumeName(x), client.VolumeRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes/"+x+"/purge", nil); code != 200 {
		t.Fatalf("acme purges %s with only its service's volume left: %d %s", x, code, body)
	}
	if _, err := h.Docker.VolumeInspect(ctx, dbVolume, client.VolumeInspectOptions{}); err == nil {
		t.Errorf("a purge left the service's volume %s", dbVolume)
	}
	if code, body := h.call(tenantAToken, "POST", "/v1/sandboxes/"+x+"/purge", nil); code != 404 {
		t.Errorf("purging %s with nothing left: %d %s, want 404", x, code, body)
	}
}
