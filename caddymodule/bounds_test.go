package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestBounds: one check refuses negative settings, whether they come from
// the Caddyfile (at adapt time, naming the line) or from JSON (at load).
func TestBounds(t *testing.T) {
	for _, tc := range []struct {
		caddyfile string // the option line
		json      string // the same setting as JSON
		want      string
	}{
		{"idle_pause -1s", `{"idle_pause":"-1s"}`, "idle_pause must not be negative (got -1s)"},
		{"hold_timeout -5s", `{"hold_timeout":"-5s"}`, "hold_timeout must not be negative (got -5s)"},
		{"event_retention -1h", `{"event_retention":"-1h"}`, "event_retention must not be negative (got -1h0m0s)"},
		{"webhook_max_age -1m", `{"webhook_max_age":"-1m"}`, "webhook_max_age must not be negative (got -1m0s)"},
		{"capacity_wait -2s", `{"capacity_wait":"-2s"}`, "capacity_wait must not be negative (got -2s)"},
		{"max_resident -1", `{"max_resident":-1}`, "max_resident must not be negative (got -1)"},
		{"max_event_streams_per_client -3", `{"max_event_streams_per_client":-3}`, "max_event_streams_per_client must not be negative (got -3)"},
		{"wake_rate -1", `{"wake_rate":-1}`, "wake_rate -1 is not a number of wakes per second >= 0"},
		{"wake_rate +Inf", "", "wake_rate +Inf is not a number of wakes per second >= 0"},
		{"", `{"wake_burst":-2}`, "wake_burst must not be negative (got -2)"},
		{"", `{"webhooks":[{"url":"https://h.example/x","secret":"s","retry_min":"-1s"}]}`, "webhook https://h.example/…: retry_min must not be negative (got -1s)"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if tc.caddyfile != "" {
				var a App
				err := a.UnmarshalCaddyfile(dispenserFor(t, "sandwake {\n\tdomain example.com\n\t"+tc.caddyfile+"\n}"))
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), ":3") {
					t.Fatalf("Caddyfile %q: %v, want %q at line 3", tc.caddyfile, err, tc.want)
				}
			}
			if tc.json != "" {
				var a App
				if err := json.Unmarshal([]byte(tc.json), &a); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
				defer cancel()
				err := a.Provision(ctx)
				if err == nil {
					err = a.Validate()
				}
				if err == nil || err.Error() != "sandwake: "+tc.want {
					t.Fatalf("JSON %s: %v, want %q", tc.json, err, "sandwake: "+tc.want)
				}
			}
		})
	}
	// Zero is a setting (off, or the default), not an error.
	var a App
	if err := a.UnmarshalCaddyfile(dispenserFor(t, "sandwake {\n\tidle_pause 0\n\tmax_resident 0\n\twake_rate 0\n\tevent_retention 0\n}")); err != nil {
		t.Fatalf("zeros: %v", err)
	}
}
