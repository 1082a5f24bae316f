package gateway

import (
	"fmt"
	"strings"

	core "github.com/sandwake/sandwake/engine"

	"github.com/sandwake/sandwake/lifecycle"
)

// IsolationState is how the engine isolates sandboxes, read at start.
type IsolationState struct {
	OK     bool   // false: the operator should know (no seccomp)
	Detail string // what readyz and the log say
}

// Check is the readyz line: "ok: …", or "ok, but …" when something is
// missing. It never makes the gateway unready: a missing profile is the
// engine's and a restart cannot fix it.
func (s IsolationState) Check() string {
	if s.OK {
		return "ok: " + s.Detail
	}
	return "ok, but " + s.Detail
}

// IsolationReport reads what the engine said of itself: its seccomp
// profile (Docker applies its default profile to every container it is
// not told otherwise about, and sandwake never tells it otherwise), its
// AppArmor and its default runtime.
func IsolationReport(c *core.Engine) IsolationState {
	if c.Kind() == core.KindKubernetes {
		// The pod spec asks for it; the node's container runtime applies it.
		return IsolationState{OK: true, Detail: "kubernetes pods: seccomp RuntimeDefault, no privilege escalation, no service-account token, capabilities " + strings.Join(lifecycle.SandboxCapabilities, ",")}
	}
	h, ok := c.Host()
	if !ok {
		return IsolationState{OK: true, Detail: "not known (the engine's info could not be read at start)"}
	}
	var parts []string
	switch h.Seccomp {
	case "", "unconfined":
		return IsolationState{Detail: fmt.Sprintf("the Docker engine applies no seccomp profile (security options: seccomp %q): sandboxes may make every system call; run an engine with seccomp, or a runtime such as runsc (the runtime option)", h.Seccomp)}
	default:
		parts = append(parts, "seccomp "+h.Seccomp)
	}
	if h.AppArmor {
		parts = append(parts, "apparmor")
	}
	if h.SELinux {
		parts = append(parts, "selinux")
	}
	if h.UserNS {
		parts = append(parts, "userns")
	}
	if h.Rootless {
		parts = append(parts, "rootless")
	}
	parts = append(parts, "runtime "+h.DefaultRuntime, "capabilities "+strings.Join(lifecycle.SandboxCapabilities, ","))
	return IsolationState{OK: true, Detail: strings.Join(parts, ", ")}
}
