package lifecycle

import (
	"context"
	"time"
)

// ContainerState is what the container engine says of a sandbox's container.
type ContainerState string

// Container states as the engine reports them.
const (
	ContainerCreated    ContainerState = "created"
	ContainerRunning    ContainerState = "running"
	ContainerPaused     ContainerState = "paused"
	ContainerRestarting ContainerState = "restarting"
	ContainerRemoving   ContainerState = "removing"
	ContainerExited     ContainerState = "exited"
	ContainerDead       ContainerState = "dead"
)

// Container describes a sandbox's container as the engine sees it.
type Container struct {
	// ID is the engine's container id.
	ID string
	// SandboxID is the sandbox the container belongs to (from its labels).
	SandboxID string
	State     ContainerState
	// ExitCode and OOMKilled describe the last exit of a stopped container.
	ExitCode  int
	OOMKilled bool
	// Upstreams maps each declared port to the address the gateway dials.
	Upstreams  map[int]string
	StartedAt  time.Time
	FinishedAt time.Time
	// Pool is the template of a container made for the warm pool ("" for
	// a sandbox's own); PoolKey its shape when it was made. A pool
	// container whose id has a record was claimed and is that sandbox's.
	Pool    string
	PoolKey string
	// Pid is the container's main process while it runs (0 otherwise);
	// MAC its interface's on the sandbox network. The firewall binds the
	// sandbox's address to the bridge port they lead to (PortBinding).
	Pid int
	MAC string
	// Published: the container publishes ports on the host (made in
	// upstream mode published).
	Published bool
	// DNSForwarded: the container resolves through the egress firewall's
	// forwarder on the sandbox network's gateway (DNSForwarding).
	DNSForwarded bool
	// Members are the states of the sandbox's services (a group), by
	// name; nil for a sandbox without services.
	Members map[string]ContainerState
}

// DNSForwarding is implemented by runtimes that can make containers
// resolve through the egress firewall's forwarder.
type DNSForwarding interface {
	// ForwardsDNS reports whether the containers it makes do.
	ForwardsDNS() bool
}

// Runtime is what the Manager needs from a container engine. Containers are
// addressed by sandbox id; the runtime names them. Implementations wrap
// ErrUnavailable for transient engine failures, ErrContainerNotFound when the
// container does not exist and ErrImageNotFound when the image cannot be had,
// so the Manager can tell a dead daemon from a dead sandbox.
type Runtime interface {
	// Create creates the sandbox's volume (when missing) and container (not
	// started) from spec, replacing any container the sandbox had.
	Create(ctx context.Context, id string, spec Spec) (Container, error)
	// Start starts the container and returns it with its upstreams re-read
	// (published host ports can change on every start).
	Start(ctx context.Context, id string) (Container, error)
	// Pause freezes the container.
	Pause(ctx context.Context, id string) error
	// Unpause thaws a paused container; its upstreams are unchanged.
	Unpause(ctx context.Context, id string) error
	// Stop stops the container, keeping it and its volume.
	Stop(ctx context.Context, id string) error
	// Remove removes the container, keeping the volume. A missing container
	// is not an error.
	Remove(ctx context.Context, id string) error
	// RemoveVolume removes the sandbox's volume and reports the bytes it held.
	// A missing volume wraps ErrNotFound.
	RemoveVolume(ctx context.Context, id string) (freed int64, err error)
	// Inspect returns the sandbox's container or ErrContainerNotFound.
	Inspect(ctx context.Context, id string) (Container, error)
	// List returns every container the runtime manages.
	List(ctx context.Context) ([]Container, error)
	// Ping checks that the engine answers.
	Ping(ctx context.Context) error
}

// Pauser is implemented by runtimes that can tell whether they pause
// sandboxes at all. A runtime without it can (Docker). One whose CanPause is
// false answers Pause with an error wrapping ErrPauseUnsupported: the
// reaper then stops a sandbox that reaches its idle_pause (the idle tiers
// collapse to a stop), and a template's pool keeps its containers running.
// A runtime that can pause may still refuse one sandbox so (Kubernetes: a
// pod it cannot resize); the reaper stops that one. PauseFreezes is false
// for a pause that only throttles (Kubernetes cuts the CPU): the process
// answers on, slowly, until a wake's change is applied, so a template's
// pool keeps its containers running there.
type Pauser interface {
	CanPause() bool
	PauseFreezes() bool
}

// DiskMeter is implemented by runtimes that can measure what a sandbox has
// written: its workspace and its container's writable layer. The disk
// watchdog uses it.
type DiskMeter interface {
	// DiskUsage returns the bytes sandbox id's workspace and writable
	// layer take on disk.
	DiskUsage(ctx context.Context, id string) (int64, error)
}

// GroupDiskMeter is implemented by DiskMeters that can tell, of a group,
// what each service wrote. The disk watchdog uses it for sandboxes with
// services: the record shows each service's part, and a service over its
// own disk_mb stops the group as the whole over the app's does.
type GroupDiskMeter interface {
	// GroupDiskUsage returns DiskUsage's total and each service's part of
	// it (its writable layer and volume) by name; services is nil when
	// the parts cannot be told apart.
	GroupDiskUsage(ctx context.Context, id string) (total int64, services map[string]int64, err error)
}

// ImageChecker is implemented by runtimes that can tell, before anything is
// created, whether an image can be had (on the engine, or pulled under the
// runtime's policy). Create uses it so that a sandbox whose image is
// missing leaves no record behind.
type ImageChecker interface {
	// CheckImage returns nil when image is available, an error wrapping
	// ErrImageNotFound when it is not, or ErrUnavailable.
	CheckImage(ctx context.Context, image string) error
}

// ImageResolver is implemented by runtimes that can tell which image an
// image reference points to now. The warm pool keys its containers by it,
// so that a retagged image replaces them.
type ImageResolver interface {
	// ImageID returns the id of the image ref names on the engine
	// (ErrImageNotFound when it has none).
	ImageID(ctx context.Context, ref string) (string, error)
}

// WorkspaceChecker is implemented by runtimes that can tell whether a
// sandbox's workspace holds anything. The pool's sweep removes the volume of
// a pool container left without a record only when it is empty: one that
// holds files may be a claimed sandbox's whose record was lost (a store
// restored from an older backup), and is kept.
type WorkspaceChecker interface {
	// WorkspaceEmpty reports whether sandbox id's workspace volume holds
	// no file (false, nil when it cannot be told).
	WorkspaceEmpty(ctx context.Context, id string) (bool, error)
}

// DirectUpstreams is implemented by runtimes that can say whether the
// gateway dials sandboxes at their own addresses, with no userland proxy in
// between (the Docker runtime's upstream mode direct): readiness then
// trusts a TCP accept, and a container made with published ports (before
// the gateway dialled addresses) is made again, volume kept, at its next
// start.
type DirectUpstreams interface {
	Direct() bool
}

// EgressEnforcer is implemented by runtimes that enforce egress policies
// themselves, with an object of their engine made beside each sandbox,
// rather than through a Firewall. The Manager then needs no Firewall for
// sandboxes to start, and asks the runtime what it can express before
// anything is stored.
type EgressEnforcer interface {
	// EnforcesEgress reports whether the runtime enforces policies
	// (false: the operator turned enforcement off).
	EnforcesEgress() bool
	// CheckEgress refuses, wrapping ErrInvalid and saying why, a
	// normalized policy the runtime cannot enforce as written.
	CheckEgress(e Egress) error
	// ApplyEgress puts spec.Egress in force for sandbox id, replacing
	// what was (a PATCH); Create puts its spec's in force before the
	// container exists.
	ApplyEgress(ctx context.Context, id string, spec Spec) error
}
