package lifecycle

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Template is a named, reusable sandbox shape: the fields of a create, and
// the warm pool of containers kept ready in that shape.
type Template struct {
	// Name is how creates refer to the template ([a-z0-9][a-z0-9_-]*).
	Name string `json:"name"`
	// Spec holds the create fields every sandbox of the template gets.
	Spec Spec `json:"spec"`
	// Pool is the template's warm pool; a zero MinIdle keeps none.
	Pool PoolConfig `json:"pool"`
}

// PoolConfig sizes a template's warm pool.
type PoolConfig struct {
	// MinIdle is how many idle containers the refill keeps ready.
	MinIdle int `json:"min_idle,omitempty"`
	// MaxIdle caps the idle containers (default: MinIdle); idle ones past
	// it are removed.
	MaxIdle int `json:"max_idle,omitempty"`
	// State is how idle containers wait: "paused" (default: no CPU, the
	// app's memory kept) or "running" (a claim skips the unpause).
	State string `json:"state,omitempty"`
	// MaxAge replaces an idle container this old (0: never).
	MaxAge time.Duration `json:"max_age,omitempty"`
}

// Pool states and the create's pool modes.
const (
	PoolPaused  = "paused"
	PoolRunning = "running"

	// PoolPrefer (the default) claims an idle container when there is
	// one and falls back to a cold create.
	PoolPrefer = "prefer"
	// PoolRequire claims or fails with ErrPoolEmpty.
	PoolRequire = "require"
	// PoolBypass always creates cold, and allows container-shaping
	// fields beside the template.
	PoolBypass = "bypass"
)

// Reasons a create from a template did not claim a pool container.
const (
	PoolMissEmpty  = "empty"  // no idle container of the template's current shape
	PoolMissBypass = "bypass" // the caller asked for a cold create
	PoolMissID     = "id"     // the caller chose the id (pool containers carry theirs)
	PoolMissEnv    = "env"    // env given at create: a container's env is fixed when it is made
	PoolMissFailed = "failed" // the claimed container could not be woken; created cold
	PoolMissNone   = "no_pool"
)

var templateName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// NormalizeTemplate checks t and fills its defaults; the error wraps
// ErrInvalid and names the template and the field.
func NormalizeTemplate(t *Template) error {
	if !templateName.MatchString(t.Name) {
		return invalid("template %q: the name must be 1-63 characters of [a-z0-9_-], starting with a letter or digit", t.Name)
	}
	if err := NormalizeSpec(&t.Spec); err != nil {
		return fmt.Errorf("template %s: %w", t.Name, err)
	}
	p := &t.Pool
	if p.MinIdle < 0 || p.MaxIdle < 0 {
		return invalid("template %s: pool: min_idle and max_idle cannot be negative", t.Name)
	}
	if p.MaxIdle == 0 {
		p.MaxIdle = p.MinIdle
	}
	if p.MaxIdle < p.MinIdle {
		return invalid("template %s: pool: max_idle %d is below min_idle %d", t.Name, p.MaxIdle, p.MinIdle)
	}
	if p.MaxIdle > MaxPoolIdle {
		return invalid("template %s: pool: max_idle %d is above %d", t.Name, p.MaxIdle, MaxPoolIdle)
	}
	switch p.State {
	case "":
		p.State = PoolPaused
	case PoolPaused, PoolRunning:
	default:
		return invalid("template %s: pool: state %q is not paused or running", t.Name, p.State)
	}
	if p.MaxAge < 0 || p.MaxAge > MaxDuration {
		return invalid("template %s: pool: max_age %s is out of range", t.Name, p.MaxAge)
	}
	return nil
}

// MaxPoolIdle bounds a template's max_idle.
const MaxPoolIdle = 256

// shapingFields names the create fields that shape a container (fixed once
// it is made), in the API's names, with a test of whether s sets them.
var shapingFields = []struct {
	name string
	set  func(s *Spec) bool
	copy func(dst, src *Spec)
}{
	{"image", func(s *Spec) bool { return s.Image != "" }, func(d, s *Spec) { d.Image = s.Image }},
	{"cmd", func(s *Spec) bool { return len(s.Cmd) > 0 }, func(d, s *Spec) { d.Cmd = s.Cmd }},
	{"ports", func(s *Spec) bool { return len(s.Ports) > 0 }, func(d, s *Spec) { d.Ports = s.Ports }},
	{"memory_mb", func(s *Spec) bool { return s.MemoryMB != 0 }, func(d, s *Spec) { d.MemoryMB = s.MemoryMB }},
	{"cpus", func(s *Spec) bool { return s.CPUs != 0 }, func(d, s *Spec) { d.CPUs = s.CPUs }},
	{"pids_limit", func(s *Spec) bool { return s.PidsLimit != 0 }, func(d, s *Spec) { d.PidsLimit = s.PidsLimit }},
	{"workspace_path", func(s *Spec) bool { return s.WorkspacePath != "" }, func(d, s *Spec) { d.WorkspacePath = s.WorkspacePath }},
	{"ready_path", func(s *Spec) bool { return s.ReadyPath != "" }, func(d, s *Spec) { d.ReadyPath = s.ReadyPath }},
	{"ready_mode", func(s *Spec) bool { return s.ReadyMode != "" }, func(d, s *Spec) { d.ReadyMode = s.ReadyMode }},
	{"user", func(s *Spec) bool { return s.User != "" }, func(d, s *Spec) { d.User = s.User }},
	{"readonly_rootfs", func(s *Spec) bool { return s.ReadonlyRootfs != nil }, func(d, s *Spec) { d.ReadonlyRootfs = s.ReadonlyRootfs }},
	{"cap_add", func(s *Spec) bool { return len(s.CapAdd) > 0 }, func(d, s *Spec) { d.CapAdd = s.CapAdd }},
	{"disk_mb", func(s *Spec) bool { return s.DiskMB != 0 }, func(d, s *Spec) { d.DiskMB = s.DiskMB }},
	{"runtime", func(s *Spec) bool { return s.Runtime != "" }, func(d, s *Spec) { d.Runtime = s.Runtime }},
	{"services", func(s *Spec) bool { return len(s.Services) > 0 }, func(d, s *Spec) { d.Services = s.Services }},
}

// fromTemplate makes the spec of a create from template t and the caller's
// fields: labels, access (and public_card when true), egress, activity, idle tiers and lifetime are the
// caller's when given; env is added to the template's; a container-shaping
// field is refused (ErrInvalid naming it) unless mode is PoolBypass, which
// takes it.
func fromTemplate(t *Template, caller *Spec, mode string) (Spec, error) {
	spec := t.Spec
	spec.Env = maps.Clone(t.Spec.Env)
	spec.Labels = maps.Clone(t.Spec.Labels)
	for _, f := range shapingFields {
		if !f.set(caller) {
			continue
		}
		if mode != PoolBypass {
			return Spec{}, invalid("%s: template %s fixes it (a pool container's %s is set when the container is made); leave it out, or send \"pool\":\"bypass\" for a cold create with it", f.name, t.Name, f.name)
		}
		f.copy(&spec, caller)
	}
	for k, v := range caller.Env {
		if spec.Env == nil {
			spec.Env = map[string]string{}
		}
		spec.Env[k] = v
	}
	for k, v := range caller.Labels {
		if spec.Labels == nil {
			spec.Labels = map[string]string{}
		}
		spec.Labels[k] = v
	}
	if caller.Access != "" {
		spec.Access = caller.Access
	}
	if caller.PublicCard {
		spec.PublicCard = true
	}
	if caller.Egress.Policy != "" || caller.Egress.Allow != nil || caller.Egress.Deny != nil {
		spec.Egress = caller.Egress
	}
	if caller.Activity != "" {
		spec.Activity = caller.Activity
	}
	if caller.IdlePause != nil {
		spec.IdlePause = caller.IdlePause
	}
	if caller.IdleStop != nil {
		spec.IdleStop = caller.IdleStop
	}
	if caller.MaxLifetime != nil {
		spec.MaxLifetime = caller.MaxLifetime
	}
	return spec, nil
}

// poolKey is the shape of a pool container: the image's id, the state it
// waits in and every field that is fixed when a container is made, as the
// gateway's defaults (isolation, memory) fill them in. A container whose
// key is not its template's current one is stale.
func poolKey(imageID, state string, s *Spec) string {
	shape := struct {
		ImageID        string
		State          string
		Cmd            []string
		Env            []string
		Ports          []int
		MemoryMB       int64
		CPUs           float64
		PidsLimit      int64
		WorkspacePath  string
		ReadyPath      string
		ReadyMode      string
		User           string
		ReadonlyRootfs *bool
		CapAdd         []string
		DiskMB         int64
		Runtime        string
		Services       map[string]Service
	}{imageID, state, s.Cmd, envList(s.Env), s.Ports, s.MemoryMB, s.CPUs, s.PidsLimit, s.WorkspacePath, s.ReadyPath, s.ReadyMode,
		s.User, s.ReadonlyRootfs, s.CapAdd, s.DiskMB, s.Runtime, s.Services}
	b, _ := json.Marshal(shape) // plain values: cannot fail
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// templateNames lists the names of ts for messages.
func templateNames(ts []Template) string {
	if len(ts) == 0 {
		return "none are configured"
	}
	names := make([]string, len(ts))
	for i := range ts {
		names[i] = ts[i].Name
	}
	return strings.Join(names, ", ")
}

// HasLabels reports whether labels carries every one of want (a label
// filter, a tenant's labels).
func HasLabels(labels, want map[string]string) bool {
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
