package cli

import (
	"testing"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// harness is the gateway the commands are run against, with this
// package's helpers on it.
type harness struct{ *gatewaytest.Harness }

func newHarness(t testing.TB, extra string) *harness {
	return &harness{gatewaytest.New(t, extra)}
}
