package lifecycle

import (
	"net"
	"testing"
)

// TestPort is the container port every test spec declares.
const TestPort = 8080

// SampleSpec is the spec of the tests' sandboxes, not yet normalised.
func SampleSpec() Spec {
	return Spec{Image: "sandwake/testapp:1", Ports: []int{TestPort}}
}

// testSpec is SampleSpec for the internal tests.
func testSpec() Spec { return SampleSpec() }

// ClosedAddr returns a loopback address nothing listens on.
func ClosedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// closedAddr is ClosedAddr for the internal tests.
var closedAddr = ClosedAddr
