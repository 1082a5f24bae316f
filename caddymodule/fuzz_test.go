package caddymodule

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"path"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle"
)

// The fuzzers below run their seeds (f.Add and testdata/fuzz/<name>) with
// every `go test`; `go test -run '^$' -fuzz '^FuzzX$' ./caddymodule/` explores.

// FuzzDecodeCreateBody feeds bytes as the body of POST /v1/sandboxes through
// the same steps as the handler (decodeBody, createBody.spec,
// lifecycle.NormalizeSpec). Nothing may panic; a refusal is a JSON error with
// a 4xx status; what is accepted satisfies the spec's invariants and is a
// fixed point of NormalizeSpec.
func FuzzDecodeCreateBody(f *testing.F) {
	for _, s := range []string{
		`{"image":"app:1","ports":[8080]}`,
		`{"id":"abc","image":"registry.example.com/app@sha256:0123","cmd":["sh","-c","x"],"env":{"A":"1"},"ports":[80,443,8080],` +
			`"memory_mb":256,"cpus":1.5,"workspace_path":"/w/./x/","ready_path":"/healthz","ready_mode":"tcp",` +
			`"idle_pause":"90s","idle_stop":"1d","max_lifetime":"0s","labels":{"k":"v"},"access":"private"}`,
		``,
		`{}`,
		`[]`,
		`null`,
		`"image"`,
		`{"image":"a","ports":[0]}`,
		`{"image":"a","ports":[65536]}`,
		`{"image":"a","ports":[80,80]}`,
		`{"image":"a","ports":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`,
		`{"image":" a b ","ports":[1]}`,
		`{"image":"\t","ports":[1]}`,
		`{"image":"a","ports":[1],"idle_pause":"-1s"}`,
		`{"image":"a","ports":[1],"idle_stop":"1.5d"}`,
		`{"image":"a","ports":[1],"max_lifetime":"forever"}`,
		`{"image":"a","ports":[1]} {}`,
		`{"image":"a","ports":[1]}]`,
		`{"image":"a","ports":[1]`,
		`{"unknown":1}`,
		`{"IMAGE":"a","Ports":[1]}`,
		`{"image":"a","ports":[1],"workspace_path":"rel"}`,
		`{"image":"a","ports":[1],"workspace_path":"/../.."}`,
		`{"image":"a","ports":[1],"ready_mode":"udp"}`,
		`{"image":"a","ports":[1],"ready_path":"healthz"}`,
		`{"image":"a","ports":[1],"access":"secret"}`,
		`{"image":"a","ports":[1],"cpus":1e400}`,
		`{"image":"a","ports":[1],"cpus":-0.5}`,
		`{"image":"a","ports":[1],"memory_mb":5}`,
		`{"image":"a","ports":[1],"env":{"":"x"}}`,
		`{"image":"a","ports":[1],"env":{"A=B":"x"}}`,
		`{"image":"a","ports":[1.5]}`,
		`{"image":"a","ports":["80"]}`,
		`{"image":"a","ports":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", bytes.NewReader(data))
		w := httptest.NewRecorder()
		var body createBody
		if !decodeBody(w, r, &body) {
			if w.Code != http.StatusBadRequest && w.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("refused body %q with status %d", data, w.Code)
			}
			var e apiError
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("refusal of %q is not a JSON error: %q (%v)", data, w.Body.Bytes(), err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("decodeBody accepted invalid JSON %q", data)
		}
		spec, err := body.spec()
		if err == nil {
			err = lifecycle.NormalizeSpec(&spec)
		}
		if err != nil {
			if !errors.Is(err, lifecycle.ErrInvalid) {
				t.Fatalf("body %q: error %v does not wrap ErrInvalid", data, err)
			}
			if status, _, _ := web.ErrorStatus(err); status != http.StatusBadRequest {
				t.Fatalf("body %q: error %v maps to %d, want 400", data, err, status)
			}
			return
		}
		checkSpec(t, data, &spec)
		// What NormalizeSpec accepted it accepts again, unchanged.
		again := spec
		again.Ports = append([]int(nil), spec.Ports...)
		if err := lifecycle.NormalizeSpec(&again); err != nil {
			t.Fatalf("body %q: normalized spec refused on a second pass: %v", data, err)
		}
		if !reflect.DeepEqual(again, spec) {
			t.Fatalf("body %q: NormalizeSpec is not idempotent:\n%+v\n%+v", data, spec, again)
		}
	})
}

// checkSpec asserts the invariants of a spec NormalizeSpec accepted.
func checkSpec(t *testing.T, data []byte, spec *lifecycle.Spec) {
	t.Helper()
	if spec.Image == "" || strings.IndexFunc(spec.Image, unicode.IsSpace) >= 0 {
		t.Fatalf("body %q: accepted image %q (empty or with white space)", data, spec.Image)
	}
	if n := len(spec.Ports); n < 1 || n > lifecycle.MaxPorts {
		t.Fatalf("body %q: accepted %d ports", data, n)
	}
	seen := map[int]bool{}
	for _, p := range spec.Ports {
		if p < 1 || p > 65535 || seen[p] {
			t.Fatalf("body %q: accepted ports %v", data, spec.Ports)
		}
		seen[p] = true
	}
	if !path.IsAbs(spec.WorkspacePath) || path.Clean(spec.WorkspacePath) != spec.WorkspacePath || spec.WorkspacePath == "/" {
		t.Fatalf("body %q: accepted workspace_path %q", data, spec.WorkspacePath)
	}
	if spec.ReadyMode != lifecycle.ReadyHTTP && spec.ReadyMode != lifecycle.ReadyTCP {
		t.Fatalf("body %q: accepted ready_mode %q", data, spec.ReadyMode)
	}
	if spec.ReadyPath != "" && spec.ReadyPath[0] != '/' {
		t.Fatalf("body %q: accepted ready_path %q", data, spec.ReadyPath)
	}
	if spec.Access != lifecycle.AccessPublic && spec.Access != lifecycle.AccessPrivate {
		t.Fatalf("body %q: accepted access %q", data, spec.Access)
	}
	for name, d := range map[string]*time.Duration{"idle_pause": spec.IdlePause, "idle_stop": spec.IdleStop, "max_lifetime": spec.MaxLifetime} {
		if d != nil && *d < 0 {
			t.Fatalf("body %q: accepted negative %s %s", data, name, *d)
		}
	}
	if spec.MemoryMB < 0 || (spec.MemoryMB > 0 && spec.MemoryMB < lifecycle.MinMemoryMB) {
		t.Fatalf("body %q: accepted memory_mb %d", data, spec.MemoryMB)
	}
	if !(spec.CPUs >= 0 && spec.CPUs <= 1024) {
		t.Fatalf("body %q: accepted cpus %v", data, spec.CPUs)
	}
	if spec.PidsLimit < 1 {
		t.Fatalf("body %q: pids_limit %d after normalizing", data, spec.PidsLimit)
	}
	for k := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			t.Fatalf("body %q: accepted env name %q", data, k)
		}
	}
}

// dispenserFor tokenizes a Caddyfile fragment. caddyfile.NewTestDispenser
// would do, but it calls log.Fatalf on input the lexer refuses (an unclosed
// quote or heredoc), which would end the fuzzer instead of skipping the input.
func dispenserFor(t *testing.T, input string) *caddyfile.Dispenser {
	t.Helper()
	tokens, err := caddyfile.Tokenize([]byte(input), "Caddyfile")
	if err != nil {
		t.Skip("not a Caddyfile the lexer accepts")
	}
	return caddyfile.NewDispenser(tokens)
}

// FuzzAppCaddyfile feeds the body of the sandwake global option to
// App.UnmarshalCaddyfile. Nothing may panic; what is accepted has no negative
// duration or count, and survives the JSON round trip parseGlobalOption makes
// (a value json.Marshal refuses would silently drop the whole app config).
func FuzzAppCaddyfile(f *testing.F) {
	for _, s := range []string{
		"",
		"domain example.com\nstorage /var/lib/sandwake\ndocker_host unix:///var/run/docker.sock\npreview_url https://*.preview.example.com",
		"idle_pause 3m\nidle_stop 0\nmax_lifetime 7d\nwake_timeout 1m\nhold_timeout 30s",
		"keepalive_max 24h\nactivity_flush 5s\nstop_timeout 10s\nreap_interval 10s\nreconcile_interval 30s",
		"webhook_max_age 1d\nevent_retention 168h",
		"upstream_mode published",
		"upstream_mode network sandboxes",
		"upstream_mode network",
		"upstream_mode bridge",
		"expired_wake refuse\norphans remove\nmin_free_memory 10%",
		"max_resident 200\nwake_rate 20\nwake_burst 40",
		"cluster {\netcd https://127.0.0.1:2379 https://127.0.0.1:2380\nnode n1\npeer_listen 127.0.0.1:7443\nadvertise 127.0.0.1:7443\npeer_ca_file /etc/ca.crt\npeer_cert_file /etc/n1.crt\npeer_key_file /etc/n1.key\nsecret 0123456789abcdef\nlease_ttl 2s\n}",
		"cluster {\nlease_ttl -1s\n}",
		"cluster x",
		"max_resident -1",
		"max_event_streams 1000\nmax_event_streams_per_client 16",
		"max_event_streams -1\nmax_event_streams_per_client x",
		"wake_rate -1",
		"wake_rate 0.5",
		"wake_rate 1e3",
		"wake_burst 0",
		"idle_pause -1s",
		"hold_timeout -5s",
		"hold_timeout 1x",
		"label team web\nlabel env \"prod stage\"",
		"label only",
		"webhook https://hooks.example.com/x {\n\tsecret s3cret\n\tevents sandbox.running sandbox.killed\n\tretry_min 2s\n}",
		"webhook https://a {\n\tretry_min 0\n}",
		"webhook https://a {\n\tunknown x\n}",
		"webhook",
		"preview_secret 0123456789abcdef0123\nrobots_txt off\nx_robots_tag \"noindex, nofollow\"",
		"robots_txt maybe",
		"no_wake_user_agents bot crawler\nno_wake_user_agents off",
		"no_wake_user_agents",
		"unknown_option 1",
		"domain a b",
		"{\n}",
		"idle_pause {\n}",
		"instance prod-1\nsandbox_network sandwake\ndefault_memory 512MiB\npull never\nallowed_images node:* registry.example.com/*",
		"instance\npull",
		"allowed_images",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		var a App
		if err := a.UnmarshalCaddyfile(dispenserFor(t, "sandwake {\n"+input+"\n}")); err != nil {
			return
		}
		for name, d := range map[string]int64{
			"max_lifetime": int64(a.MaxLifetime), "wake_timeout": int64(a.WakeTimeout), "hold_timeout": int64(a.HoldTimeout),
			"keepalive_max": int64(a.KeepaliveMax), "activity_flush": int64(a.ActivityFlush), "stop_timeout": int64(a.StopTimeout),
			"reap_interval": int64(a.ReapInterval), "reconcile_interval": int64(a.ReconcileInterval),
			"webhook_max_age": int64(a.WebhookMaxAge), "event_retention": int64(a.EventRetention),
		} {
			if d < 0 {
				t.Fatalf("input %q: accepted negative %s %d", input, name, d)
			}
		}
		if (a.IdlePause != nil && *a.IdlePause < 0) || (a.IdleStop != nil && *a.IdleStop < 0) {
			t.Fatalf("input %q: accepted a negative idle tier", input)
		}
		if a.MaxResident != nil && *a.MaxResident < 0 {
			t.Fatalf("input %q: accepted max_resident %d", input, *a.MaxResident)
		}
		if (a.MaxEventStreams != nil && *a.MaxEventStreams < 0) || (a.MaxEventStreamsPerClient != nil && *a.MaxEventStreamsPerClient < 0) {
			t.Fatalf("input %q: accepted a negative event stream cap", input)
		}
		if a.WakeRate != nil && !(*a.WakeRate >= 0 && !math.IsInf(*a.WakeRate, 0)) {
			// NaN and ±Inf also make json.Marshal fail, so parseGlobalOption
			// would hand Caddy a null sandwake app: every setting dropped.
			t.Fatalf("input %q: accepted wake_rate %v (want a finite number >= 0)", input, *a.WakeRate)
		}
		if a.WakeBurst < 0 {
			t.Fatalf("input %q: accepted wake_burst %d", input, a.WakeBurst)
		}
		for _, w := range a.Webhooks {
			if w.RetryMin < 0 || w.URL == "" {
				t.Fatalf("input %q: accepted webhook %+v", input, w)
			}
		}
		if a.UpstreamMode == "network" && a.Network == "" {
			t.Fatalf("input %q: upstream_mode network without a network", input)
		}
		// parseGlobalOption hands the app to Caddy as JSON.
		if raw := caddyconfig.JSON(&a, nil); raw == nil {
			_, err := json.Marshal(&a)
			t.Fatalf("input %q: accepted, but the app does not marshal to JSON: %v", input, err)
		} else {
			var back App
			if err := json.Unmarshal(raw, &back); err != nil {
				t.Fatalf("input %q: the app's JSON %s does not unmarshal: %v", input, raw, err)
			}
			if again := caddyconfig.JSON(&back, nil); !bytes.Equal(again, raw) {
				t.Fatalf("input %q: JSON round trip changed the app:\n%s\n%s", input, raw, again)
			}
		}
	})
}

// FuzzAPICaddyfile feeds the body of a sandwake_api block to
// API.UnmarshalCaddyfile: nothing may panic, and what is accepted either has
// authentication or says explicitly that it has none (Validate agrees).
func FuzzAPICaddyfile(f *testing.F) {
	for _, s := range []string{
		"",
		"token {env.SANDWAKE_API_TOKEN}",
		"token s3cret",
		"insecure_no_auth",
		"insecure_no_auth yes",
		"token",
		"token a b",
		"token \"\"",
		"unknown",
		"token a\ninsecure_no_auth",
		"{\n}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		var api API
		if err := api.UnmarshalCaddyfile(dispenserFor(t, "sandwake_api {\n"+input+"\n}")); err != nil {
			return
		}
		if err := api.Validate(); (err == nil) != (api.Token != "" || api.InsecureNoAuth) {
			t.Fatalf("input %q: token %q insecure_no_auth %v: Validate says %v", input, api.Token, api.InsecureNoAuth, err)
		}
		raw := caddyconfig.JSON(&api, nil)
		var back API
		if raw == nil || json.Unmarshal(raw, &back) != nil || back.Token != api.Token || back.InsecureNoAuth != api.InsecureNoAuth {
			t.Fatalf("input %q: JSON round trip of %+v failed: %s", input, api, raw)
		}
	})
}

// FuzzPreviewCaddyfile feeds what follows the sandwake_preview directive
// (matcher, reverse_proxy subdirectives) through the Caddyfile adapter, so
// that parsePreview gets a real httpcaddyfile.Helper: one built outside the
// adapter lacks the warnings and group counter reverse_proxy's
// handle_response needs, and would crash in Caddy, not in sandwake. Nothing
// may panic; when the adapter accepts the input, every gate is followed by a
// reverse_proxy whose only upstream source is sandwake's.
func FuzzPreviewCaddyfile(f *testing.F) {
	for _, s := range []string{
		"",
		"{\n\tflush_interval -1\n}",
		"/api/* {\n\ttransport http {\n\t\tdial_timeout 2s\n\t}\n}",
		"* {\n\tlb_policy first\n\theader_up X-Sandbox {host}\n}",
		"{\n\tto localhost:9000\n}",
		"localhost:9000",
		"{\n\tdynamic a\n}",
		"{\n\t@err status 5xx\n\thandle_response @err {\n\t\trespond \"down\" 503\n\t}\n}",
		"@api\n@api path /api/*",
		"{\n\ttransport fastcgi\n}",
		"{\n\tunknown_subdirective\n}",
		"{\n\tfail_duration 30s\n\tmax_fails 3\n\thealth_uri /healthz\n}",
	} {
		f.Add(s)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	f.Fuzz(func(t *testing.T, input string) {
		// The adapter reads files named by import; fuzzing must not.
		if strings.Contains(strings.ToLower(input), "import") {
			t.Skip()
		}
		site := "{\n\tadmin off\n}\nhttp://*.preview.localhost {\n\tsandwake_preview " + input + "\n}\n"
		cfg, _, err := adapter.Adapt([]byte(site), nil)
		if err != nil {
			return
		}
		var doc any
		if err := json.Unmarshal(cfg, &doc); err != nil {
			t.Fatalf("input %q: adapted config is not JSON: %v", input, err)
		}
		gates := 0
		var walk func(v any)
		walk = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				if hs, ok := v["handle"].([]any); ok {
					for i, h := range hs {
						m, _ := h.(map[string]any)
						if m == nil || m["handler"] != "sandwake" {
							continue
						}
						gates++
						if i+1 >= len(hs) {
							t.Fatalf("input %q: gate with no reverse_proxy after it: %s", input, cfg)
						}
						rp, _ := hs[i+1].(map[string]any)
						if rp == nil || rp["handler"] != "reverse_proxy" || rp["upstreams"] != nil {
							t.Fatalf("input %q: gate not followed by an upstream-less reverse_proxy: %s", input, cfg)
						}
						du, _ := rp["dynamic_upstreams"].(map[string]any)
						if du == nil || du["source"] != "sandwake" {
							t.Fatalf("input %q: reverse_proxy after the gate has dynamic upstreams %v, want sandwake's", input, rp["dynamic_upstreams"])
						}
					}
				}
				for _, c := range v {
					walk(c)
				}
			case []any:
				for _, c := range v {
					walk(c)
				}
			}
		}
		walk(doc)
		if gates == 0 {
			t.Fatalf("input %q: adapted without a sandwake gate: %s", input, cfg)
		}
	})
}
