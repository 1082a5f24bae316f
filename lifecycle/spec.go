package lifecycle

import (
	"fmt"
	"path"
	"strings"
	"time"
	"unicode"

	"github.com/sandwake/sandwake/store"
)

// Spec is a sandbox's container specification (see store.Spec).
type Spec = store.Spec

// Record is a sandbox's stored state (see store.Record).
type Record = store.Record

// Event is one entry of the event log (see store.Event).
type Event = store.Event

// Limits of a spec, so that one request cannot ask for absurd resources.
const (
	// MaxPorts is the most ports a sandbox may declare.
	MaxPorts = 16
	// MinMemoryMB is Docker's smallest memory limit.
	MinMemoryMB = 6
	// DefaultWorkspacePath is where the volume is mounted when unset.
	DefaultWorkspacePath = "/workspace"
	// DefaultPidsLimit caps processes per sandbox when unset.
	DefaultPidsLimit = 512
)

// Access levels of a sandbox.
const (
	AccessPublic  = "public"
	AccessPrivate = "private"
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// NormalizeSpec checks spec and fills its defaults. The error wraps ErrInvalid
// and names the offending field.
func NormalizeSpec(spec *Spec) error {
	spec.Image = strings.TrimSpace(spec.Image)
	if spec.Image == "" {
		return invalid("image is required")
	}
	if strings.IndexFunc(spec.Image, unicode.IsSpace) >= 0 {
		return invalid("image %q contains white space", spec.Image)
	}
	if len(spec.Ports) == 0 {
		return invalid("ports: at least one port is required")
	}
	if len(spec.Ports) > MaxPorts {
		return invalid("ports: at most %d ports, got %d", MaxPorts, len(spec.Ports))
	}
	seen := make(map[int]bool, len(spec.Ports))
	for _, p := range spec.Ports {
		if p < 1 || p > 65535 {
			return invalid("ports: %d is not a port (1-65535)", p)
		}
		if seen[p] {
			return invalid("ports: %d declared twice", p)
		}
		seen[p] = true
	}
	for k := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return invalid("env: %q is not a variable name", k)
		}
	}
	if spec.MemoryMB < 0 || (spec.MemoryMB > 0 && spec.MemoryMB < MinMemoryMB) {
		return invalid("memory_mb: %d is below the minimum of %d", spec.MemoryMB, MinMemoryMB)
	}
	if !(spec.CPUs >= 0 && spec.CPUs <= 1024) { // also refuses NaN
		return invalid("cpus: %g is out of range", spec.CPUs)
	}
	if spec.PidsLimit < 0 {
		return invalid("pids_limit: %d is negative", spec.PidsLimit)
	}
	if spec.PidsLimit == 0 {
		spec.PidsLimit = DefaultPidsLimit
	}
	if spec.WorkspacePath == "" {
		spec.WorkspacePath = DefaultWorkspacePath
	}
	if !path.IsAbs(spec.WorkspacePath) || path.Clean(spec.WorkspacePath) == "/" {
		return invalid("workspace_path: %q must be an absolute path below /", spec.WorkspacePath)
	}
	spec.WorkspacePath = path.Clean(spec.WorkspacePath)
	if spec.ReadyPath != "" && !strings.HasPrefix(spec.ReadyPath, "/") {
		return invalid("ready_path: %q must start with /", spec.ReadyPath)
	}
	switch spec.ReadyMode {
	case "":
		spec.ReadyMode = ReadyHTTP
	case ReadyHTTP, ReadyTCP:
	default:
		return invalid("ready_mode: %q is not http or tcp", spec.ReadyMode)
	}
	for name, d := range map[string]*time.Duration{"idle_pause": spec.IdlePause, "idle_stop": spec.IdleStop, "max_lifetime": spec.MaxLifetime} {
		if d != nil && *d < 0 {
			return invalid("%s: %s is negative", name, *d)
		}
	}
	switch spec.Access {
	case "":
		spec.Access = AccessPublic
	case AccessPublic, AccessPrivate:
	default:
		return invalid("access: %q is not public or private", spec.Access)
	}
	return nil
}
