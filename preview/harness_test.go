package preview_test

import (
	"testing"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// harness is a gateway in this process (see gatewaytest), with this
// package's test helpers on it.
type harness struct{ *gatewaytest.Harness }

func newHarness(t testing.TB, extra string) *harness {
	return &harness{gatewaytest.New(t, extra)}
}

func newHarnessWithCaddyfile(t testing.TB, render func(h *harness) string) *harness {
	return &harness{gatewaytest.NewWithCaddyfile(t, func(g *gatewaytest.Harness) string { return render(&harness{g}) })}
}
