package docker

import (
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// TestLateOOMReport: Docker 20.10 on cgroup v2 may report a container's
// exit before its OOM kill, with OOMKilled false; once the oom event came,
// Inspect reports that exit as an OOM kill, and only that one.
func TestLateOOMReport(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	exited := func(code int) lifecycle.Container {
		return lifecycle.Container{State: lifecycle.ContainerExited, ExitCode: code}
	}
	for _, tc := range []struct {
		name   string
		saw    bool
		c      lifecycle.Container
		after  time.Duration
		want   bool
		forget bool // the report is gone after the inspect
	}{
		{name: "no report", c: exited(137)},
		{name: "reported", saw: true, c: exited(137), want: true},
		{name: "reported, at the bound", saw: true, c: exited(137), after: oomMemory, want: true},
		{name: "reported too long ago", saw: true, c: exited(137), after: oomMemory + time.Second},
		{name: "another exit code", saw: true, c: exited(1)},
		{name: "running again", saw: true, c: lifecycle.Container{State: lifecycle.ContainerRunning}, forget: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o oomReports
			if tc.saw {
				o.saw("app1", t0)
			}
			c := tc.c
			o.explain("app1", &c, t0.Add(tc.after))
			if c.OOMKilled != tc.want {
				t.Fatalf("OOMKilled = %v, want %v", c.OOMKilled, tc.want)
			}
			// Another sandbox's report says nothing of app1, and app1's
			// report, unless forgotten, explains its exit again.
			other := exited(137)
			o.explain("app2", &other, t0)
			again := exited(137)
			o.explain("app1", &again, t0)
			if other.OOMKilled || again.OOMKilled != (tc.saw && !tc.forget) {
				t.Fatalf("after: app2 OOMKilled %v, app1's exit again %v", other.OOMKilled, again.OOMKilled)
			}
		})
	}
	// Reports older than oomMemory are dropped when a new one comes.
	var o oomReports
	o.saw("old", t0)
	o.saw("new", t0.Add(oomMemory+time.Second))
	if _, ok := o.at["old"]; ok || len(o.at) != 1 {
		t.Fatalf("reports kept: %v", o.at)
	}
}
