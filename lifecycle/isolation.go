package lifecycle

import (
	"regexp"
	"slices"
	"strings"
)

// SandboxCapabilities are the only Linux capabilities a sandbox's
// processes hold: Docker's default set without MKNOD, NET_RAW, SETFCAP,
// SETPCAP, AUDIT_WRITE and SYS_CHROOT, which no preview app needs and
// which widen what code running as root in the container can do. A
// process of a non-root user holds none of them (no-new-privileges keeps
// setuid binaries from regaining them).
var SandboxCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID"}

// AddableCapabilities are those a sandbox's cap_add may give back: the rest
// of Docker's default set. Anything beyond Docker's defaults (SYS_ADMIN,
// NET_ADMIN, …) is never granted to a sandbox.
var AddableCapabilities = []string{"AUDIT_WRITE", "MKNOD", "NET_RAW", "SETFCAP", "SETPCAP", "SYS_CHROOT"}

// Isolation bounds a sandbox's container beyond its resources: the gateway's
// defaults for the spec fields of the same names, and what only the
// gateway sets.
type Isolation struct {
	// User is the default user ("" : the image's own).
	User string
	// ReadonlyRootfs is the default of a spec's readonly_rootfs.
	ReadonlyRootfs bool
	// Runtime is the default OCI runtime ("": the engine's default).
	Runtime string
	// Runtimes are the runtimes the engine has; a spec naming another is
	// refused. Nil: not known (not checked here; the engine refuses).
	Runtimes []string
	// CPUs is the CPU limit of a spec that gives none (0: unlimited).
	CPUs float64
	// DiskMB is the disk quota of a spec that gives none (0: none).
	DiskMB int64
}

// MaxDiskMB bounds disk_mb (16 TiB).
const MaxDiskMB = 1 << 24

// userPattern is what a user may be: a name or uid, optionally :group or
// :gid, as Docker takes them.
var userPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$`)

// runtimePattern is what an OCI runtime name may be.
var runtimePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// CheckIsolation checks a spec's user, capabilities and runtime alone,
// without the gateway's defaults or the engine's runtimes.
func CheckIsolation(spec *Spec) error {
	return normalizeIsolation(spec, Isolation{})
}

// normalizeIsolation checks the spec's isolation fields and fills them from
// the gateway's defaults, so that the record says what the sandbox runs
// with.
func normalizeIsolation(spec *Spec, iso Isolation) error {
	spec.User = strings.TrimSpace(spec.User)
	if spec.User == "" {
		spec.User = iso.User
	}
	if spec.User != "" && !userPattern.MatchString(spec.User) {
		return invalid("user: %q is not a user (uid[:gid] or name[:group])", spec.User)
	}
	if spec.ReadonlyRootfs == nil {
		ro := iso.ReadonlyRootfs
		spec.ReadonlyRootfs = &ro
	}
	caps := make([]string, 0, len(spec.CapAdd))
	for _, c := range spec.CapAdd {
		c = strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(c)), "CAP_")
		if !slices.Contains(AddableCapabilities, c) {
			return invalid("cap_add: %q cannot be given to a sandbox (only %s)", c, strings.Join(AddableCapabilities, ", "))
		}
		if !slices.Contains(caps, c) {
			caps = append(caps, c)
		}
	}
	slices.Sort(caps)
	spec.CapAdd = caps
	if len(spec.CapAdd) == 0 {
		spec.CapAdd = nil
	}
	if spec.Runtime == "" {
		spec.Runtime = iso.Runtime
	}
	if spec.Runtime != "" {
		if !runtimePattern.MatchString(spec.Runtime) {
			return invalid("runtime: %q is not a runtime name", spec.Runtime)
		}
		if iso.Runtimes != nil && !slices.Contains(iso.Runtimes, spec.Runtime) {
			return invalid("runtime: %q is not installed on the Docker engine (it has: %s)", spec.Runtime, strings.Join(iso.Runtimes, ", "))
		}
	}
	if spec.CPUs == 0 {
		spec.CPUs = iso.CPUs
	}
	if spec.DiskMB < 0 || spec.DiskMB > MaxDiskMB {
		return invalid("disk_mb: %d is out of range (0-%d)", spec.DiskMB, MaxDiskMB)
	}
	if spec.DiskMB == 0 {
		spec.DiskMB = iso.DiskMB
	}
	return nil
}
