package lifecycle_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/lifecycletest"
)

// TestLearnedNamesAreExact: a lookup of a literal "*.name" that resolved
// (a wildcard record answers it) is neither learned nor locked, nor is one
// a record kept from an earlier release: a lock writes exact names.
func TestLearnedNamesAreExact(t *testing.T) {
	star := func(l []string) bool {
		return slices.ContainsFunc(l, func(e string) bool { return strings.Contains(e, "*") })
	}
	l := lookupLog("*.injected.test", "api.example.com")
	if got := lifecycle.Learned(l); star(got) || !slices.Equal(got, []string{"api.example.com"}) {
		t.Errorf("learned %v, want [api.example.com]", got)
	}
	if got := lifecycle.MergeLearned([]string{"*.old.test", "a.example.com", "198.51.100.7:443/tcp"}, nil); !slices.Equal(got, []string{"a.example.com", "198.51.100.7:443/tcp"}) {
		t.Errorf("merged %v, want the star label dropped", got)
	}
	for _, n := range []string{"*.x.test", "a.*.test", "*"} {
		if lifecycle.LearnableName(n) {
			t.Errorf("%q is learnable", n)
		}
	}

	fw := &learningFirewall{fakeFirewall: &fakeFirewall{entries: map[netip.Addr]lifecycle.FirewallEntry{}}, logs: map[string]lifecycle.EgressLog{}, grew: map[string]bool{}}
	env := newTestEnvWith(t, lifecycle.Config{Firewall: fw}, func(rt *lifecycletest.Runtime) lifecycle.Runtime { return netRuntime{rt} })
	spec := testSpec()
	spec.Egress = lifecycle.Egress{Policy: lifecycle.EgressLearn}
	if _, err := env.m.Create(context.Background(), lifecycle.CreateRequest{ID: "learner", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	fw.set("learner", l)
	if err := env.m.FlushActivity(); err != nil {
		t.Fatal(err)
	}
	if rec, _ := env.m.Get("learner"); star(rec.EgressLearned) {
		t.Errorf("the record keeps %v", rec.EgressLearned)
	}
	locked, err := env.m.LockEgress("learner")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"api.example.com"}; !slices.Equal(locked.Spec.Egress.Allow, want) {
		t.Errorf("locked to %v, want %v", locked.Spec.Egress.Allow, want)
	}
	// A record an earlier release left with a star label.
	r := lifecycle.Record{EgressLearned: []string{"*.old.test", "b.example.com"}}
	if got := lifecycle.LockList(&r, lifecycle.EgressLog{}); !slices.Equal(got, []string{"b.example.com"}) {
		t.Errorf("a lock of a record keeping *.old.test writes %v", got)
	}
}
