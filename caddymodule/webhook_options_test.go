package caddymodule

import (
	"testing"
)

// TestWebhookURLFromPlaceholder: a webhook URL may come from the
// environment (secret URLs stay out of the Caddyfile); an unset variable is
// an error naming the placeholder, and errors about a literal URL show only
// its scheme and host.
func TestWebhookURLFromPlaceholder(t *testing.T) {
	t.Setenv("SANDWAKE_TEST_HOOK_URL", "https://hooks.example.com/services/T0/B0/sekret")
	checkOption(t, "webhook {env.SANDWAKE_TEST_HOOK_URL} {\nsecret whsec-placeholder\n}", "", func(t *testing.T, a *App) {
		if len(a.hooks) != 1 || a.hooks[0].URL != "https://hooks.example.com/services/T0/B0/sekret" {
			t.Fatalf("hooks %+v, want the URL from the environment", a.hooks)
		}
	})
	checkOption(t, "webhook {env.SANDWAKE_TEST_HOOK_UNSET} {\nsecret whsec-placeholder\n}", "{env.SANDWAKE_TEST_HOOK_UNSET}: the URL is empty", nil)
	checkOption(t, "webhook https://hooks.example.com/services/T0/B0/sekret {\nsecret whsec\nevents sandbox.nope\n}", "https://hooks.example.com/…: \"sandbox.nope\" is not an event type", nil)
}
