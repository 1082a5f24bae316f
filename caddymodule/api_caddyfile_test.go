package caddymodule

import (
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/api"
)

// TestTokenOptions: the token block's scope and labels are parsed; bad
// scopes, labels, options and duplicate secrets are refused naming them.
// (What each token may do once provisioned: api's TestProvisionTokens.)
func TestTokenOptions(t *testing.T) {
	parse := func(input string) (*API, error) {
		a := new(API)
		d := dispenserFor(t, "sandwake_api {\n"+input+"\n}")
		if err := a.UnmarshalCaddyfile(d); err != nil {
			return a, err
		}
		_, err := api.New(a.Config, nil, zap.NewNop())
		return a, err
	}
	a, err := parse("token admin-secret-0123456789\ntoken dash-secret-0123456789 {\nscope read\n}\ntoken acme-secret-0123456789 {\nscope operate\nlabels tenant=acme team=web\n}")
	if err != nil {
		t.Fatal(err)
	}
	if a.Token != "admin-secret-0123456789" || len(a.Tokens) != 2 {
		t.Fatalf("token %q, %d more tokens", a.Token, len(a.Tokens))
	}
	if tc := a.Tokens[0]; tc.Secret != "dash-secret-0123456789" || tc.Scope != "read" || tc.Labels != nil {
		t.Fatalf("second token: %+v", tc)
	}
	if tc := a.Tokens[1]; tc.Scope != "operate" || tc.Labels["tenant"] != "acme" || tc.Labels["team"] != "web" {
		t.Fatalf("third token: %+v", tc)
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
