package peer

import (
	"testing"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestRemoteEvents: catalog changes of other nodes' sandboxes become one
// event per state change; this node's own entries and changes that keep the
// state are left out; a subscriber that falls behind loses its subscription
// (lagged) without blocking the watch.
func TestRemoteEvents(t *testing.T) {
	r := newRemoteEvents("self")
	sub := r.Subscribe()
	entry := func(id, node string, st lifecycle.State) cluster.Change {
		return cluster.Change{Entry: cluster.Entry{ID: id, Node: node, State: st}}
	}
	r.observe(entry("a", "other", lifecycle.Creating))
	r.observe(entry("a", "other", lifecycle.Running))
	r.observe(entry("a", "other", lifecycle.Running)) // tokens rotated, say
	r.observe(entry("mine", "self", lifecycle.Running))
	r.observe(cluster.Change{Entry: cluster.Entry{ID: "a", Node: "other"}, Deleted: true})
	want := []struct {
		typ      string
		from, to lifecycle.State
	}{
		{"sandbox.creating", "", lifecycle.Creating},
		{"sandbox.running", lifecycle.Creating, lifecycle.Running},
		{"sandbox.destroyed", lifecycle.Running, ""},
	}
	for i, w := range want {
		select {
		case ev := <-sub.C:
			if ev.Type != w.typ || ev.From != w.from || ev.To != w.to || ev.SandboxID != "a" || ev.Node != "other" || ev.At.IsZero() {
				t.Fatalf("event %d: %+v, want %+v", i, ev, w)
			}
		default:
			t.Fatalf("event %d (%s) missing", i, w.typ)
		}
	}
	select {
	case ev := <-sub.C:
		t.Fatalf("unexpected event %+v", ev)
	default:
	}

	// A full subscriber is dropped, the watch goes on.
	for i := range remoteEventBuffer + 1 {
		st := lifecycle.Running
		if i%2 == 1 {
			st = lifecycle.Paused
		}
		r.observe(entry("b", "other", st))
	}
	n := 0
	for range sub.C {
		n++
	}
	if n != remoteEventBuffer || !sub.Lagged {
		t.Fatalf("got %d buffered events, lagged %v; want %d and lagged", n, sub.Lagged, remoteEventBuffer)
	}
	sub.Cancel() // no-op once dropped

	other := r.Subscribe()
	r.close()
	if _, ok := <-other.C; ok || other.Lagged {
		t.Fatal("close must end subscriptions without marking them lagged")
	}
	if _, ok := <-r.Subscribe().C; ok {
		t.Fatal("a subscription after close must be closed")
	}
}
