package api_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/api"
	swclient "github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// apiAnswer is one raw answer of the management API.
type apiAnswer struct {
	status int
	header http.Header
	body   []byte
}

// errorBody decodes {"error":{"code":…,"message":…}}; it fails the test when
// the body is not that shape.
func (a apiAnswer) errorBody(t testing.TB) swclient.ErrorBody {
	t.Helper()
	var e swclient.ErrorResponse
	if err := json.Unmarshal(a.body, &e); err != nil || e.Error.Code == "" {
		t.Fatalf("status %d: body %q is not a JSON error (%v)", a.status, a.body, err)
	}
	return e.Error
}

// apiRaw calls the management API with body sent verbatim (nil: no body) and
// auth as the Authorization header ("" sends none).
func (h *harness) apiRaw(method, path, auth string, body io.Reader) apiAnswer {
	h.T.Helper()
	req, err := http.NewRequest(method, h.APIURL(path), body)
	if err != nil {
		h.T.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.T.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.T.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return apiAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

// listIDs lists the ids of the sandboxes GET /v1/sandboxes<query> answers.
func (h *harness) listIDs(query string) []string {
	h.T.Helper()
	var out struct {
		Sandboxes []swclient.Sandbox `json:"sandboxes"`
	}
	if status := h.API("GET", "/v1/sandboxes"+query, nil, &out); status != http.StatusOK {
		h.T.Fatalf("GET /v1/sandboxes%s: %d", query, status)
	}
	ids := make([]string, 0, len(out.Sandboxes))
	for _, s := range out.Sandboxes {
		ids = append(ids, s.ID)
	}
	return ids
}

func randomSuffix() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func TestAPIRoundTrip(t *testing.T) {
	h := newHarness(t, "")
	id := testenv.UniqueID("api")
	h.RemoveOnCleanup(id)
	secret := "hunter2-" + randomSuffix()
	ctx := context.Background()

	// call sends body as JSON and checks, for every answer, that the env
	// value never appears in it.
	call := func(method, path string, body any, wantStatus int) apiAnswer {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			rd = strings.NewReader(string(b))
		}
		a := h.apiRaw(method, path, "Bearer "+gatewaytest.Token, rd)
		if a.status != wantStatus {
			t.Fatalf("%s %s: %d %s, want %d", method, path, a.status, a.body, wantStatus)
		}
		if strings.Contains(string(a.body), secret) {
			t.Fatalf("%s %s: the answer contains an env value: %s", method, path, a.body)
		}
		return a
	}
	record := func(method, path string, body any, wantState string) swclient.Sandbox {
		t.Helper()
		a := call(method, path, body, http.StatusOK)
		var rec swclient.Sandbox
		if err := json.Unmarshal(a.body, &rec); err != nil {
			t.Fatalf("%s %s: decoding %q: %v", method, path, a.body, err)
		}
		if rec.ID != id || rec.State != wantState {
			t.Fatalf("%s %s: id %q state %q, want %q %q", method, path, rec.ID, rec.State, id, wantState)
		}
		return rec
	}

	a := call("POST", "/v1/sandboxes", map[string]any{
		"id": id, "image": h.Image, "ports": []int{8080},
		"env": map[string]string{"SECRET_X": secret},
	}, http.StatusCreated)
	var rec swclient.Sandbox
	if err := json.Unmarshal(a.body, &rec); err != nil {
		t.Fatalf("create: decoding %q: %v", a.body, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(a.body, &raw); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"open_connections", "env_keys", "urls", "ports", "created_at", "state_since", "access", "workspace_path"} {
		if _, ok := raw[key]; !ok {
			t.Errorf("create: record has no %q: %s", key, a.body)
		}
	}
	if _, ok := raw["env"]; ok {
		t.Errorf("create: record has an env field: %s", a.body)
	}
	wantURL := fmt.Sprintf("http://s-%s-8080.preview.localhost:%d/", id, h.PreviewPort)
	switch {
	case rec.ID != id || rec.State != "running":
		t.Fatalf("create: id %q state %q", rec.ID, rec.State)
	case !slices.Equal(rec.EnvKeys, []string{"SECRET_X"}):
		t.Errorf("env_keys = %q, want [SECRET_X]", rec.EnvKeys)
	case len(rec.URLs) != 1 || rec.URLs["8080"] != wantURL:
		t.Errorf("urls = %v, want {8080: %s}", rec.URLs, wantURL)
	case !slices.Equal(rec.Ports, []int{8080}):
		t.Errorf("ports = %v", rec.Ports)
	case rec.Image != h.Image || rec.WorkspacePath != "/workspace" || rec.Access != "public":
		t.Errorf("image %q workspace_path %q access %q", rec.Image, rec.WorkspacePath, rec.Access)
	case rec.OpenConnections != 0:
		t.Errorf("open_connections = %d, want 0", rec.OpenConnections)
	}

	got := record("GET", "/v1/sandboxes/"+id, nil, "running")
	if got.URLs["8080"] != wantURL || !slices.Equal(got.EnvKeys, []string{"SECRET_X"}) {
		t.Errorf("get: urls %v env_keys %q", got.URLs, got.EnvKeys)
	}
	// Ids are case-insensitive in paths too.
	record("GET", "/v1/sandboxes/"+strings.ToUpper(id), nil, "running")

	for _, tt := range []struct {
		query string
		want  bool
	}{
		{"", true},
		{"?state=running", true},
		{"?state=stopped", false},
		{"?state=paused", false},
	} {
		call("GET", "/v1/sandboxes"+tt.query, nil, http.StatusOK)
		if has := slices.Contains(h.listIDs(tt.query), id); has != tt.want {
			t.Errorf("list%s: contains %s = %v, want %v", tt.query, id, has, tt.want)
		}
	}

	record("POST", "/v1/sandboxes/"+id+"/pause", nil, "paused")
	if !slices.Contains(h.listIDs("?state=paused"), id) {
		t.Errorf("list ?state=paused does not show the paused sandbox")
	}
	record("POST", "/v1/sandboxes/"+id+"/wake", nil, "running")
	record("POST", "/v1/sandboxes/"+id+"/stop", nil, "stopped")
	record("POST", "/v1/sandboxes/"+id+"/wake", nil, "running")

	// Keepalive: set, and capped by keepalive_max (24h by default).
	for _, tt := range []struct {
		dur             string
		atLeast, atMost time.Duration // keepalive_until - now
	}{
		{"10m", 10 * time.Minute, 10 * time.Minute},
		{"999h", 23 * time.Hour, 24 * time.Hour}, // capped at keepalive_max
	} {
		before := time.Now()
		rec := record("POST", "/v1/sandboxes/"+id+"/keepalive", map[string]string{"for": tt.dur}, "running")
		after := time.Now()
		if rec.KeepaliveUntil == nil {
			t.Fatalf("keepalive %s: keepalive_until not set", tt.dur)
		}
		until := *rec.KeepaliveUntil
		if until.Before(before.Add(tt.atLeast).Truncate(time.Second)) || until.After(after.Add(tt.atMost)) {
			t.Errorf("keepalive %s: keepalive_until %s, want within [%s, %s]", tt.dur, until, before.Add(tt.atLeast), after.Add(tt.atMost))
		}
	}

	var hist struct {
		Events []struct {
			ID        uint64 `json:"id"`
			Type      string `json:"type"`
			SandboxID string `json:"sandbox_id"`
			To        string `json:"to"`
		} `json:"events"`
	}
	a = call("GET", "/v1/sandboxes/"+id+"/history", nil, http.StatusOK)
	if err := json.Unmarshal(a.body, &hist); err != nil {
		t.Fatalf("history: decoding %q: %v", a.body, err)
	}
	var states []string
	for i, ev := range hist.Events {
		states = append(states, ev.To)
		if ev.SandboxID != id || ev.Type != "sandbox."+ev.To {
			t.Errorf("history event %d: %+v", i, ev)
		}
		if i > 0 && ev.ID <= hist.Events[i-1].ID {
			t.Errorf("history event ids out of order: %d after %d", ev.ID, hist.Events[i-1].ID)
		}
	}
	if want := []string{"creating", "running", "paused", "running", "stopped", "running"}; !slices.Equal(states, want) {
		t.Fatalf("history = %q, want %q", states, want)
	}

	// Destroy: record and container gone, volume kept.
	a = call("DELETE", "/v1/sandboxes/"+id, nil, http.StatusNoContent)
	if len(a.body) != 0 {
		t.Errorf("destroy: 204 with body %q", a.body)
	}
	if e := call("GET", "/v1/sandboxes/"+id, nil, http.StatusNotFound).errorBody(t); e.Code != "not_found" {
		t.Errorf("get after destroy: code %q", e.Code)
	}
	if slices.Contains(h.listIDs(""), id) {
		t.Errorf("list after destroy still shows %s", id)
	}
	if _, err := h.Docker.ContainerInspect(ctx, docker.ContainerName(id), client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("container after destroy: inspect error %v, want not found", err)
	}
	if _, err := h.Docker.VolumeInspect(ctx, docker.VolumeName(id), client.VolumeInspectOptions{}); err != nil {
		t.Fatalf("volume after destroy: %v (destroy must keep it)", err)
	}

	// Purge: the volume goes too, once.
	a = call("POST", "/v1/sandboxes/"+id+"/purge", nil, http.StatusOK)
	var purged map[string]json.RawMessage
	if err := json.Unmarshal(a.body, &purged); err != nil {
		t.Fatalf("purge: decoding %q: %v", a.body, err)
	}
	var freed int64
	if err := json.Unmarshal(purged["freed_bytes"], &freed); err != nil || freed < 0 {
		t.Errorf("purge: freed_bytes in %s: %d %v", a.body, freed, err)
	}
	if _, err := h.Docker.VolumeInspect(ctx, docker.VolumeName(id), client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("volume after purge: inspect error %v, want not found", err)
	}
	if e := call("POST", "/v1/sandboxes/"+id+"/purge", nil, http.StatusNotFound).errorBody(t); e.Code != "not_found" {
		t.Errorf("second purge: code %q", e.Code)
	}
}

func TestAPIAuth(t *testing.T) {
	h := newHarness(t, "")
	id := testenv.UniqueID("auth")
	h.RemoveOnCleanup(id)
	createBody := fmt.Sprintf(`{"id":%q,"image":%q,"ports":[8080]}`, id, h.Image)
	routes := []struct {
		method, path, body string
	}{
		{"POST", "/v1/sandboxes", createBody},
		{"GET", "/v1/sandboxes", ""},
		{"GET", "/v1/sandboxes?state=running", ""},
		{"GET", "/v1/sandboxes/" + id, ""},
		{"DELETE", "/v1/sandboxes/" + id, ""},
		{"POST", "/v1/sandboxes/" + id + "/wake", ""},
		{"POST", "/v1/sandboxes/" + id + "/pause", ""},
		{"POST", "/v1/sandboxes/" + id + "/stop", ""},
		{"POST", "/v1/sandboxes/" + id + "/keepalive", `{"for":"10m"}`},
		{"POST", "/v1/sandboxes/" + id + "/purge", ""},
		{"GET", "/v1/sandboxes/" + id + "/history", ""},
	}
	auths := []struct {
		name, header, says string
	}{
		{"no token", "", "missing Authorization header"},
		{"wrong token", "Bearer wrong-" + gatewaytest.Token, "wrong bearer token"},
		{"token prefix", "Bearer " + gatewaytest.Token[:len(gatewaytest.Token)-1], "wrong bearer token"},
		{"token without Bearer", gatewaytest.Token, "is not Bearer"},
		{"basic auth", "Basic " + gatewaytest.Token, `scheme "Basic" is not Bearer`},
		// The scheme is case-insensitive (RFC 7235): "bearer <token>" is
		// accepted (TestAuthSchemesCaseInsensitive); a wrong one is not.
		{"lower-case scheme, wrong token", "bearer wrong-" + gatewaytest.Token, "wrong bearer token"},
	}
	for _, rt := range routes {
		for _, au := range auths {
			var body io.Reader
			if rt.body != "" {
				body = strings.NewReader(rt.body)
			}
			a := h.apiRaw(rt.method, rt.path, au.header, body)
			if a.status != http.StatusUnauthorized {
				t.Errorf("%s %s, %s: %d %s, want 401", rt.method, rt.path, au.name, a.status, a.body)
				continue
			}
			if e := a.errorBody(t); e.Code != "unauthorized" || !strings.Contains(e.Message, au.says) {
				t.Errorf("%s %s, %s: error %+v, want unauthorized saying %q", rt.method, rt.path, au.name, e, au.says)
			}
			if !strings.HasPrefix(a.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s, %s: WWW-Authenticate %q", rt.method, rt.path, au.name, a.header.Get("WWW-Authenticate"))
			}
			if ct := a.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s %s, %s: Content-Type %q", rt.method, rt.path, au.name, ct)
			}
		}
	}
	for _, path := range []string{"/v1/healthz", "/v1/readyz"} {
		if a := h.apiRaw("GET", path, "", nil); a.status != http.StatusOK {
			t.Errorf("GET %s without token: %d %s", path, a.status, a.body)
		}
	}
	// readyz without a token names its checks with ok or fail only: no
	// storage path, instance or engine detail; with the token, all of it.
	var bare map[string]any
	if a := h.apiRaw("GET", "/v1/readyz", "", nil); json.Unmarshal(a.body, &bare) != nil {
		t.Fatalf("readyz without token: %s", a.body)
	} else {
		checks, _ := bare["checks"].(map[string]any)
		for name, v := range checks {
			if v != "ok" && v != "fail" {
				t.Errorf("readyz without token: check %s = %q, want ok or fail", name, v)
			}
		}
		if len(bare) != 2 || len(checks) < 5 || strings.Contains(string(a.body), h.Instance()) || strings.Contains(string(a.body), "seccomp") {
			t.Errorf("readyz without token tells more than each check's state: %s", a.body)
		}
	}
	var full struct {
		Instance string            `json:"instance"`
		Checks   map[string]string `json:"checks"`
	}
	if status := h.API("GET", "/v1/readyz", nil, &full); status != 200 || full.Instance == "" || !strings.HasPrefix(full.Checks["isolation"], "ok: seccomp") {
		t.Errorf("readyz with the token: %d %+v, want the instance and the isolation detail", status, full)
	}
	// The upstream mode in force and why: direct on this machine (a local
	// engine, the sandbox bridge in the gateway's namespace).
	if up := full.Checks["upstreams"]; !strings.HasPrefix(up, "direct: ") || !strings.Contains(up, "is on this host") {
		t.Errorf("readyz's upstreams check: %q, want direct and why", up)
	}
	// exclude: the checks named are reported but not counted; a name
	// that is no check is a 400 naming them.
	var ex struct {
		Ready    bool     `json:"ready"`
		Excluded []string `json:"excluded"`
	}
	if a := h.apiRaw("GET", "/v1/readyz?exclude=docker,cluster&exclude=store", "", nil); a.status != 400 || !strings.Contains(string(a.body), "exclude=cluster names no check") {
		t.Errorf("readyz excluding a check a single host has not: %d %s, want 400 naming the checks", a.status, a.body)
	}
	if a := h.apiRaw("GET", "/v1/readyz?exclude=docker&exclude=store", "", nil); a.status != 200 || json.Unmarshal(a.body, &ex) != nil || !ex.Ready || strings.Join(ex.Excluded, ",") != "docker,store" {
		t.Errorf("readyz excluding docker and store: %d %s, want 200 with both excluded", a.status, a.body)
	}
	// None of the refused requests did anything.
	if ids := h.listIDs(""); len(ids) != 0 {
		t.Fatalf("unauthenticated requests made sandboxes: %v", ids)
	}
	if _, err := h.Docker.ContainerInspect(context.Background(), docker.ContainerName(id), client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Fatalf("unauthenticated create made a container: %v", err)
	}
}

func TestAPIBadInput(t *testing.T) {
	h := newHarness(t, "")
	ctx := context.Background()
	var madeIDs []string
	// valid is a create body that is correct but for what edit changes; each
	// has its own id so that a body wrongly accepted is found and cleaned up.
	valid := func(edit func(m map[string]any)) string {
		id := testenv.UniqueID("bad")
		h.RemoveOnCleanup(id)
		madeIDs = append(madeIDs, id)
		m := map[string]any{"id": id, "image": h.Image, "ports": []int{8080}}
		edit(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	set := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	validOK := valid(func(map[string]any) {})

	creates := []struct {
		name    string
		body    *string // nil: no body at all
		status  int
		mention string // the message names this (the field, or what is wrong)
	}{
		{"not JSON", strPtr("image=alpine&ports=8080"), 400, "request body is not valid JSON: unexpected character 'i' at byte 1"},
		{"empty body", nil, 400, "empty"},
		{"empty string body", strPtr(""), 400, "empty"},
		{"JSON array", strPtr(`[1,2]`), 400, "request body"},
		{"unknown field", strPtr(valid(set("imagez", "x"))), 400, `"imagez"`},
		{"trailing object", strPtr(validOK + ` {"a":1}`), 400, "after the JSON object"},
		{"trailing garbage", strPtr(validOK + ` xyz`), 400, "after the JSON object"},
		{"trailing brace", strPtr(valid(func(map[string]any) {}) + `}`), 400, "after the JSON object"},
		{"truncated", strPtr(validOK[:len(validOK)-1]), 400, "request body"},
		{"missing image", strPtr(valid(func(m map[string]any) { delete(m, "image") })), 400, "image"},
		{"blank image", strPtr(valid(set("image", "  "))), 400, "image"},
		{"missing ports", strPtr(valid(func(m map[string]any) { delete(m, "ports") })), 400, "ports"},
		{"ports empty", strPtr(valid(set("ports", []int{}))), 400, "ports"},
		{"port 0", strPtr(valid(set("ports", []int{0}))), 400, "ports: 0"},
		{"port 70000", strPtr(valid(set("ports", []int{70000}))), 400, "ports: 70000"},
		{"port negative", strPtr(valid(set("ports", []int{-1}))), 400, "ports: -1"},
		{"port as string", strPtr(valid(set("ports", []string{"8080"}))), 400, "ports"},
		{"duplicate ports", strPtr(valid(set("ports", []int{8080, 8080}))), 400, "8080 declared twice"},
		{"bad id", strPtr(valid(set("id", "UP_PER!"))), 400, `id "UP_PER!"`},
		{"id too long", strPtr(valid(set("id", strings.Repeat("a", 41)))), 400, "id "},
		{"idle_pause not a duration", strPtr(valid(set("idle_pause", "soon"))), 400, "idle_pause"},
		{"idle_stop negative", strPtr(valid(set("idle_stop", "-5m"))), 400, "idle_stop"},
		{"max_lifetime not a duration", strPtr(valid(set("max_lifetime", "forever"))), 400, "max_lifetime"},
		{"memory_mb too small", strPtr(valid(set("memory_mb", 3))), 400, "memory_mb"},
		{"cpus negative", strPtr(valid(set("cpus", -1))), 400, "cpus"},
		{"access", strPtr(valid(set("access", "secret"))), 400, "access"},
		{"workspace_path relative", strPtr(valid(set("workspace_path", "work"))), 400, "workspace_path"},
		{"ready_path relative", strPtr(valid(set("ready_path", "healthz"))), 400, "ready_path"},
		{"env name with =", strPtr(valid(set("env", map[string]string{"A=B": "c"}))), 400, "env"},
		{"over 1 MiB", strPtr(`{"image":"` + strings.Repeat("a", api.MaxBodyBytes+1) + `","ports":[8080]}`), 413, "bytes"},
	}
	for _, tt := range creates {
		t.Run("create/"+tt.name, func(t *testing.T) {
			var body io.Reader
			if tt.body != nil {
				body = strings.NewReader(*tt.body)
			}
			a := h.apiRaw("POST", "/v1/sandboxes", "Bearer "+gatewaytest.Token, body)
			if a.status != tt.status {
				t.Fatalf("%d %.300s, want %d", a.status, a.body, tt.status)
			}
			e := a.errorBody(t)
			wantCode := "invalid"
			if tt.status == http.StatusRequestEntityTooLarge {
				wantCode = "too_large"
			}
			if e.Code != wantCode || !strings.Contains(e.Message, tt.mention) || strings.Contains(e.Message, "invalid request") {
				t.Errorf("error %+v, want code %q and a message naming %q (without Go's sentinel words)", e, wantCode, tt.mention)
			}
		})
	}

	unknown := testenv.UniqueID("nosuch")
	long := strings.Repeat("a", 41)
	ops := []struct {
		name         string
		method, path string
		body         string
		status       int
		code         string
	}{
		{"keepalive not a duration", "POST", "/v1/sandboxes/" + unknown + "/keepalive", `{"for":"abc"}`, 400, "invalid"},
		{"keepalive negative", "POST", "/v1/sandboxes/" + unknown + "/keepalive", `{"for":"-5m"}`, 400, "invalid"},
		{"keepalive zero", "POST", "/v1/sandboxes/" + unknown + "/keepalive", `{"for":"0s"}`, 400, "invalid"},
		{"keepalive no body", "POST", "/v1/sandboxes/" + unknown + "/keepalive", "", 400, "invalid"},
		{"keepalive unknown field", "POST", "/v1/sandboxes/" + unknown + "/keepalive", `{"for":"1m","x":1}`, 400, "invalid"},
		{"list bogus state", "GET", "/v1/sandboxes?state=bogus", "", 400, "invalid"},
		{"get unknown", "GET", "/v1/sandboxes/" + unknown, "", 404, "not_found"},
		{"wake unknown", "POST", "/v1/sandboxes/" + unknown + "/wake", "", 404, "not_found"},
		{"pause unknown", "POST", "/v1/sandboxes/" + unknown + "/pause", "", 404, "not_found"},
		{"stop unknown", "POST", "/v1/sandboxes/" + unknown + "/stop", "", 404, "not_found"},
		{"keepalive unknown", "POST", "/v1/sandboxes/" + unknown + "/keepalive", `{"for":"1m"}`, 404, "not_found"},
		{"history unknown", "GET", "/v1/sandboxes/" + unknown + "/history", "", 404, "not_found"},
		{"destroy unknown", "DELETE", "/v1/sandboxes/" + unknown, "", 404, "not_found"},
		{"purge unknown", "POST", "/v1/sandboxes/" + unknown + "/purge", "", 404, "not_found"},
		{"get invalid id", "GET", "/v1/sandboxes/bad-id%21", "", 404, "not_found"},
		{"wake invalid id", "POST", "/v1/sandboxes/bad-id%21/wake", "", 404, "not_found"},
		{"destroy invalid id", "DELETE", "/v1/sandboxes/bad-id%21", "", 404, "not_found"},
		{"purge invalid id", "POST", "/v1/sandboxes/bad-id%21/purge", "", 404, "not_found"},
		{"get 41-char id", "GET", "/v1/sandboxes/" + long, "", 404, "not_found"},
		{"stop 41-char id", "POST", "/v1/sandboxes/" + long + "/stop", "", 404, "not_found"},
		{"purge 41-char id", "POST", "/v1/sandboxes/" + long + "/purge", "", 404, "not_found"},
		{"unknown route", "GET", "/v1/nothing", "", 404, "not_found"},
	}
	for _, tt := range ops {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			a := h.apiRaw(tt.method, tt.path, "Bearer "+gatewaytest.Token, body)
			if a.status != tt.status {
				t.Fatalf("%s %s: %d %.300s, want %d", tt.method, tt.path, a.status, a.body, tt.status)
			}
			if e := a.errorBody(t); e.Code != tt.code || e.Message == "" {
				t.Errorf("%s %s: error %+v, want code %q", tt.method, tt.path, e, tt.code)
			}
		})
	}

	// Nothing was half-created: no record, no container, no volume.
	if ids := h.listIDs(""); len(ids) != 0 {
		t.Errorf("bad requests left sandboxes: %v", ids)
	}
	for _, id := range madeIDs {
		if _, err := h.Docker.ContainerInspect(ctx, docker.ContainerName(id), client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
			t.Errorf("bad request left container %s (inspect error %v)", docker.ContainerName(id), err)
		}
		if _, err := h.Docker.VolumeInspect(ctx, docker.VolumeName(id), client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
			t.Errorf("bad request left volume %s (inspect error %v)", docker.VolumeName(id), err)
		}
	}
}

func strPtr(s string) *string { return &s }

func TestAPIConflict(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	id := rec.ID
	createAgain := func(id string) func() apiAnswer {
		return func() apiAnswer {
			body := fmt.Sprintf(`{"id":%q,"image":%q,"ports":[8080]}`, id, h.Image)
			return h.apiRaw("POST", "/v1/sandboxes", "Bearer "+gatewaytest.Token, strings.NewReader(body))
		}
	}
	post := func(path string) func() apiAnswer {
		return func() apiAnswer { return h.apiRaw("POST", path, "Bearer "+gatewaytest.Token, nil) }
	}
	tests := []struct {
		name      string
		before    func() // puts the sandbox in the state the case needs
		do        func() apiAnswer
		status    int
		code      string
		wantState string // the sandbox's state afterwards: untouched
	}{
		{"create same id", nil, createAgain(id), 409, "exists", "running"},
		{"create same id upper case", nil, createAgain(strings.ToUpper(id)), 409, "exists", "running"},
		{"pause stopped", func() { h.Stop(id) }, post("/v1/sandboxes/" + id + "/pause"), 409, "conflict", "stopped"},
		{"create same id while stopped", nil, createAgain(id), 409, "exists", "stopped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			a := tt.do()
			if a.status != tt.status {
				t.Fatalf("%d %s, want %d", a.status, a.body, tt.status)
			}
			if e := a.errorBody(t); e.Code != tt.code || e.Message == "" {
				t.Errorf("error %+v, want code %q", e, tt.code)
			}
			if s := h.State(id); s != tt.wantState {
				t.Errorf("state afterwards %q, want %q", s, tt.wantState)
			}
		})
	}
	if ids := h.listIDs(""); !slices.Equal(ids, []string{id}) {
		t.Fatalf("sandboxes %v, want only %s", ids, id)
	}
}
