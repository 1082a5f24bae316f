package caddymodule

import (
	"strings"
	"testing"
)

// TestTokenOptions: the token block's scope and labels are parsed; bad
// scopes, labels, options and duplicate secrets are refused naming them.
func TestTokenOptions(t *testing.T) {
	parse := func(input string) (*API, error) {
		api := new(API)
		d := dispenserFor(t, "sandwake_api {\n"+input+"\n}")
		if err := api.UnmarshalCaddyfile(d); err != nil {
			return api, err
		}
		return api, api.provisionTokens()
	}
	api, err := parse("token admin-secret-0123456789\ntoken dash-secret-0123456789 {\nscope read\n}\ntoken acme-secret-0123456789 {\nscope operate\nlabels tenant=acme team=web\n}")
	if err != nil {
		t.Fatal(err)
	}
	if api.Token != "admin-secret-0123456789" || len(api.tokens) != 3 {
		t.Fatalf("token %q, %d tokens", api.Token, len(api.tokens))
	}
	if p := api.tokens[1].who; p.scope != ScopeRead || p.bound() {
		t.Fatalf("second token: %+v", p)
	}
	if p := api.tokens[2].who; p.scope != ScopeOperate || p.labels["tenant"] != "acme" || p.labels["team"] != "web" {
		t.Fatalf("third token: %+v", p)
	}
	for _, tt := range []struct{ input, wantErr string }{
		{"token a-secret-0123456789 {\nscope root\n}", "scope"},
		{"token a-secret-0123456789 {\nlabels tenant\n}", "key=value"},
		{"token a-secret-0123456789 {\nrole admin\n}", "unknown token option"},
		{"token a-secret-0123456789\ntoken a-secret-0123456789 {\nscope read\n}", "same secret"},
		{"token {env.SANDWAKE_TEST_UNSET_TOKEN}", "empty once placeholders"},
	} {
		if _, err := parse(tt.input); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%q: %v, want an error naming %q", tt.input, err, tt.wantErr)
		}
	}
}
