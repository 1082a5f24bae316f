package lifecycle_test

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// denyingFirewall is a fakeFirewall that observes: the test calls the
// function the manager gave it with the events of refused egress, as the
// firewall does once it has bounded them (egress/denials.go), and it keeps
// the sandboxes whose denials it was told to forget.
type denyingFirewall struct {
	*fakeFirewall
	mu        sync.Mutex
	denied    func(lifecycle.Event) bool
	forgotten []string
}

func (f *denyingFirewall) EgressLog(string) lifecycle.EgressLog { return lifecycle.EgressLog{} }
func (f *denyingFirewall) Outbound(netip.Addr) time.Time        { return time.Time{} }
func (f *denyingFirewall) OnDenied(fn func(lifecycle.Event) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.denied = fn
}

func (f *denyingFirewall) ForgetDenials(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgotten = append(f.forgotten, id)
}

func (f *denyingFirewall) report(ev lifecycle.Event) bool {
	f.mu.Lock()
	fn := f.denied
	f.mu.Unlock()
	return fn(ev)
}

// TestDeniedEgressIsRecorded: what the firewall reports of refused egress
// (a denied destination, a window's summary) is recorded in the sandbox's
// history with its incarnation and labels, and published once; a report of
// a sandbox without a record writes nothing and says so (the firewall then
// summarises nothing of it); the firewall is told to forget a sandbox's
// denials when its record goes.
func TestDeniedEgressIsRecorded(t *testing.T) {
	fw := &denyingFirewall{fakeFirewall: &fakeFirewall{entries: map[netip.Addr]lifecycle.FirewallEntry{}}}
	e, _ := newClockEnv(t, lifecycle.Config{Firewall: fw})
	e.seedWith(t, "flood", lifecycle.Running, func(r *lifecycle.Record) {
		r.Incarnation, r.Spec.Labels = "inc-flood", map[string]string{"tenant": "acme"}
	})
	published := 0
	var pmu sync.Mutex
	e.hooks.onEvent(func(ev lifecycle.Event) {
		if ev.SandboxID == "flood" {
			pmu.Lock()
			published++
			pmu.Unlock()
		}
	})

	if !fw.report(lifecycle.Event{Type: lifecycle.EventEgressDenied, SandboxID: "flood", Reason: "198.51.100.1:1000/udp"}) {
		t.Fatalf("a denial of a sandbox with a record is reported not recorded")
	}
	summary := lifecycle.DenialSummary{From: testClock, Until: testClock.Add(time.Minute), Logged: 1, Suppressed: 9, Destinations: 1,
		Top: []lifecycle.DeniedCount{{Destination: "198.51.100.1:1000/udp", Count: 9}}}
	if !fw.report(lifecycle.Event{Type: lifecycle.EventEgressDeniedSummary, SandboxID: "flood", Reason: "9 denials", Denials: &summary}) {
		t.Fatalf("a summary of a sandbox with a record is reported not recorded")
	}
	if fw.report(lifecycle.Event{Type: lifecycle.EventEgressDenied, SandboxID: "nobody", Reason: "198.51.100.2:1000/udp"}) {
		t.Errorf("a denial of a sandbox without a record is reported recorded")
	}
	if evs := e.history(t, "nobody"); len(evs) != 0 {
		t.Errorf("events of a sandbox without a record: %+v", evs)
	}

	var denied, summaries []lifecycle.Event
	for _, ev := range e.history(t, "flood") {
		switch ev.Type {
		case lifecycle.EventEgressDenied:
			denied = append(denied, ev)
		case lifecycle.EventEgressDeniedSummary:
			summaries = append(summaries, ev)
		}
	}
	if len(denied) != 1 || denied[0].Reason != "198.51.100.1:1000/udp" || denied[0].Incarnation != "inc-flood" || denied[0].Labels["tenant"] != "acme" {
		t.Errorf("egress_denied events %+v, want the one reported with the sandbox's incarnation and labels", denied)
	}
	if len(summaries) != 1 || summaries[0].Denials == nil || summaries[0].Denials.Suppressed != 9 || summaries[0].Reason != "9 denials" ||
		summaries[0].Incarnation != "inc-flood" || summaries[0].Labels["tenant"] != "acme" {
		t.Errorf("summaries %+v, want the one reported with its counts, the sandbox's incarnation and labels", summaries)
	}
	pmu.Lock()
	if published != 2 {
		t.Errorf("%d events of the sandbox published, want 2", published)
	}
	pmu.Unlock()

	if err := e.m.Destroy(context.Background(), "flood", "api"); err != nil {
		t.Fatal(err)
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if !slices.Equal(fw.forgotten, []string{"flood"}) {
		t.Errorf("the firewall was told to forget the denials of %v, want the destroyed sandbox's", fw.forgotten)
	}
}
