package api

import (
	"testing"

	"go.uber.org/zap"
)

// TestProvisionTokens: Token is an admin token of every sandbox; each of
// Tokens has its scope (admin by default) and its labels.
func TestProvisionTokens(t *testing.T) {
	h, err := New(Config{Token: "admin-secret-0123456789", Tokens: []TokenConfig{
		{Secret: "dash-secret-0123456789", Scope: "read"},
		{Secret: "acme-secret-0123456789", Scope: "operate", Labels: map[string]string{"tenant": "acme", "team": "web"}},
	}}, nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if len(h.tokens) != 3 {
		t.Fatalf("%d tokens, want 3", len(h.tokens))
	}
	if p := h.tokens[0].who; p.scope != ScopeAdmin || p.bound() {
		t.Fatalf("first token: %+v", p)
	}
	if p := h.tokens[1].who; p.scope != ScopeRead || p.bound() {
		t.Fatalf("second token: %+v", p)
	}
	if p := h.tokens[2].who; p.scope != ScopeOperate || p.labels["tenant"] != "acme" || p.labels["team"] != "web" {
		t.Fatalf("third token: %+v", p)
	}
}
