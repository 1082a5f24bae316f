package docker

import (
	"sync"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file keeps the engine's OOM reports for the exits they explain.
// Docker 20.10 takes an OOM kill from containerd's TaskOOM event, which may
// arrive after the task's exit: the exit then says OOMKilled false, and
// only the oom event after it tells an OOM kill from another exit of code
// 137. Inspect reports such an exit as an OOM kill, so the Manager, which
// reconciles the sandbox at that event, sees it as one.

// oomExitCode is the exit code of a process the kernel's OOM killer ended
// (128 + SIGKILL).
const oomExitCode = 137

// oomMemory is how long an OOM report is kept for the exit it explains.
const oomMemory = 30 * time.Second

// oomReports are the OOM kills the event stream reported, by sandbox id,
// and when.
type oomReports struct {
	mu sync.Mutex
	at map[string]time.Time
}

// saw notes the engine's report of an OOM kill in sandbox id's container,
// forgetting the reports older than oomMemory.
func (o *oomReports) saw(id string, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, at := range o.at {
		if now.Sub(at) > oomMemory {
			delete(o.at, k)
		}
	}
	if o.at == nil {
		o.at = make(map[string]time.Time)
	}
	o.at[id] = now
}

// explain marks c, sandbox id's container as inspected, OOM-killed when
// it exited with oomExitCode and a recent report speaks of it. A running
// container forgets the report: it speaks of the run before.
func (o *oomReports) explain(id string, c *lifecycle.Container, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.at[id]
	switch {
	case !ok:
	case c.State == lifecycle.ContainerRunning:
		delete(o.at, id)
	case c.ExitCode == oomExitCode && now.Sub(at) <= oomMemory:
		c.OOMKilled = true
	}
}
