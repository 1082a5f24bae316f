package lifecycle

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/distribution/reference"
)

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
	// MaxMemoryMB bounds memory_mb (1 TiB): larger values are typos, and
	// past 2^43 MiB the byte count overflows into "no limit".
	MaxMemoryMB = 1 << 20
	// MaxCPUs bounds cpus when the host's CPU count is not known.
	MaxCPUs = 1024
	// MaxPidsLimit bounds pids_limit (the kernel's pid_max ceiling).
	MaxPidsLimit = 1 << 22
	// MaxDuration bounds idle_pause, idle_stop and max_lifetime (10 years).
	MaxDuration = 10 * 365 * 24 * time.Hour
	// MaxEnvBytes bounds the total size of env keys and values.
	MaxEnvBytes = 256 << 10
	// MaxLabels and MaxLabelBytes bound the caller's labels.
	MaxLabels     = 64
	MaxLabelBytes = 1024
)

// systemPaths cannot be a workspace: a volume mounted there hides what the
// image needs to run, or (below /proc, /sys, /dev) Docker refuses it.
var systemPaths = []string{"/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/root", "/run", "/sbin", "/usr", "/var", "/var/lib", "/var/run"}

// kernelPaths and everything below them cannot be a workspace.
var kernelPaths = []string{"/proc", "/sys", "/dev"}

// Access levels of a sandbox.
const (
	AccessPublic  = "public"
	AccessPrivate = "private"
)

// checkWorkspacePath refuses a workspace path (of field, as the error
// names it) that is not absolute, is /, is below a kernel file system
// (/proc, /sys, /dev: Docker refuses a volume there, in words naming its
// own directories) or is a system path, and answers it cleaned.
func checkWorkspacePath(field, p string) (string, error) {
	if !path.IsAbs(p) || path.Clean(p) == "/" {
		return p, invalid("%s: %q must be an absolute path below /", field, p)
	}
	p = path.Clean(p)
	for _, k := range kernelPaths {
		if p == k || strings.HasPrefix(p, k+"/") {
			return p, invalid("%s: %q is a system path (nothing under %s can be a workspace)", field, p, k)
		}
	}
	if slices.Contains(systemPaths, p) {
		return p, invalid("%s: %q is a system path; use a directory of its own such as /workspace", field, p)
	}
	if strings.ContainsRune(p, 0) {
		return p, invalid("%s: %q contains a NUL byte", field, p)
	}
	return p, nil
}

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
	if _, err := reference.ParseNormalizedNamed(spec.Image); err != nil {
		return invalid("image %q is not an image reference (name[:tag][@digest]): %v", spec.Image, err)
	}
	for i, arg := range spec.Cmd {
		if strings.ContainsRune(arg, 0) {
			return invalid("cmd[%d] contains a NUL byte", i)
		}
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
	envBytes := 0
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00\n\r") {
			return invalid("env: %q is not a variable name (it must be non-empty, without =, NUL or line breaks)", k)
		}
		if strings.ContainsRune(v, 0) {
			return invalid("env: the value of %s contains a NUL byte", k)
		}
		envBytes += len(k) + len(v)
	}
	if envBytes > MaxEnvBytes {
		return invalid("env: %d bytes in all, at most %d", envBytes, MaxEnvBytes)
	}
	if spec.MemoryMB < 0 || (spec.MemoryMB > 0 && spec.MemoryMB < MinMemoryMB) {
		return invalid("memory_mb: %d is below the minimum of %d", spec.MemoryMB, MinMemoryMB)
	}
	if spec.MemoryMB > MaxMemoryMB {
		return invalid("memory_mb: %d is above the maximum of %d (1 TiB)", spec.MemoryMB, MaxMemoryMB)
	}
	if !(spec.CPUs >= 0 && spec.CPUs <= MaxCPUs) { // also refuses NaN
		return invalid("cpus: %g is out of range (0-%d)", spec.CPUs, MaxCPUs)
	}
	if spec.PidsLimit < 0 || spec.PidsLimit > MaxPidsLimit {
		return invalid("pids_limit: %d is out of range (0-%d)", spec.PidsLimit, MaxPidsLimit)
	}
	if len(spec.Labels) > MaxLabels {
		return invalid("labels: %d labels, at most %d", len(spec.Labels), MaxLabels)
	}
	for k, v := range spec.Labels {
		if k == "" || len(k)+len(v) > MaxLabelBytes {
			return invalid("labels: %q must be a non-empty key, key and value at most %d bytes", k, MaxLabelBytes)
		}
	}
	if spec.PidsLimit == 0 {
		spec.PidsLimit = DefaultPidsLimit
	}
	if spec.WorkspacePath == "" {
		spec.WorkspacePath = DefaultWorkspacePath
	}
	var err error
	if spec.WorkspacePath, err = checkWorkspacePath("workspace_path", spec.WorkspacePath); err != nil {
		return err
	}
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
	if err := checkTiers(spec.IdlePause, spec.IdleStop, spec.MaxLifetime); err != nil {
		return err
	}
	switch spec.Activity {
	case "", ActivityInbound, ActivityAny:
	default:
		return invalid("activity: %q is not inbound or any", spec.Activity)
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

// ImageAllowed reports whether image matches one of patterns: path.Match
// globs tried on the reference as given and in its normalised form
// ("node:22" is also "docker.io/library/node:22"). A reference without a tag
// is matched as ":latest" too.
func ImageAllowed(patterns []string, image string) bool {
	forms := []string{image}
	if named, err := reference.ParseNormalizedNamed(image); err == nil {
		forms = append(forms, named.String(), reference.TagNameOnly(named).String(), reference.FamiliarString(reference.TagNameOnly(named)))
	}
	for _, p := range patterns {
		for _, f := range forms {
			if ok, _ := path.Match(p, f); ok {
				return true
			}
		}
	}
	return false
}

// checkTiers refuses a sandbox's own idle tiers and lifetime (nil: the
// gateway's) outside 0 to MaxDuration. Creates and updates both use it.
func checkTiers(idlePause, idleStop, maxLifetime *time.Duration) error {
	for _, t := range []struct {
		name string
		d    *time.Duration
	}{{"idle_pause", idlePause}, {"idle_stop", idleStop}, {"max_lifetime", maxLifetime}} {
		if t.d != nil && (*t.d < 0 || *t.d > MaxDuration) {
			return invalid("%s: %s is out of range (0 to 10 years)", t.name, *t.d)
		}
	}
	return nil
}
