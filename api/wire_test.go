package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestWireEvent: the events the API writes (lifecycle.Event) and the
// client's Event are the same JSON, both ways.
func TestWireEvent(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, ev := range []lifecycle.Event{
		{ID: 9, Type: "sandbox.paused", SandboxID: "abc", From: lifecycle.Running, To: lifecycle.Paused, Reason: "idle", At: at},
		{ID: 10, Type: "sandbox.destroyed", SandboxID: "abc", From: lifecycle.Stopped, At: at},
		{SandboxID: "abc", Type: "sandbox.running", To: lifecycle.Running},
		{ID: 11, Type: "sandbox.creating", SandboxID: "abc", To: lifecycle.Creating, At: at, Incarnation: "inc", Labels: map[string]string{"tenant": "acme"}},
	} {
		server, _ := json.Marshal(ev)
		var c client.Event
		if err := json.Unmarshal(server, &c); err != nil {
			t.Fatal(err)
		}
		back, _ := json.Marshal(c)
		if string(back) != string(server) {
			t.Fatalf("client.Event writes %s, the API %s", back, server)
		}
	}
}
