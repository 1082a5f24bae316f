package caddymodule

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// The fuzzers below run their seeds (f.Add and testdata/fuzz/<name>) with
// every `go test`; `go test -run '^$' -fuzz '^FuzzX$' ./caddymodule/` explores.

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
		var a API
		if err := a.UnmarshalCaddyfile(dispenserFor(t, "sandwake_api {\n"+input+"\n}")); err != nil {
			return
		}
		if err := a.Validate(); (err == nil) != (a.Token != "" || a.InsecureNoAuth) {
			t.Fatalf("input %q: token %q insecure_no_auth %v: Validate says %v", input, a.Token, a.InsecureNoAuth, err)
		}
		raw := caddyconfig.JSON(&a, nil)
		var back API
		if raw == nil || json.Unmarshal(raw, &back) != nil || back.Token != a.Token || back.InsecureNoAuth != a.InsecureNoAuth {
			t.Fatalf("input %q: JSON round trip of %+v failed: %s", input, a, raw)
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
		"{\n\ttransport http {\n\t\tcompression off\n\t\tkeepalive 30s\n\t}\n}",
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
						// The gateway never asks a sandbox for an encoding
						// on a client's behalf, nor inflates its answer.
						if tr, _ := rp["transport"].(map[string]any); tr["protocol"] == "http" && tr["compression"] != false {
							t.Fatalf("input %q: the http transport after the gate has compression %v, want false: %s", input, tr["compression"], cfg)
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
