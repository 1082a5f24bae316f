package lifecycle

import "slices"

// State is a sandbox's lifecycle state (see docs/DESIGN.md, "States"). The
// Store keeps it and compares it; this package owns its values and the
// transition table.
type State string

// The states of a sandbox.
const (
	// Creating: the container is being created; waking is refused.
	Creating State = "creating"
	// Running: the container is up and its port answered the readiness probe.
	Running State = "running"
	// Paused: the container is frozen (docker pause); it keeps its memory.
	Paused State = "paused"
	// Stopped: the container has exited; its disk is kept.
	Stopped State = "stopped"
	// Killed: the container is gone (removed, OOM, killed outside sandwake);
	// a wake recreates it from the stored spec and volume.
	Killed State = "killed"
	// Expired: the container was removed at max_lifetime; the volume is kept.
	Expired State = "expired"
	// Error: creating or waking failed; the record's Error says why.
	Error State = "error"
)

// States lists every state, in lifecycle order.
var States = []State{Creating, Running, Paused, Stopped, Killed, Expired, Error}

// allowedFrom is the transition table: for each target state, the states a
// sandbox may enter it from. Every transition in the system is checked
// against it (Store.Transition compares and sets atomically).
var allowedFrom = map[State][]State{
	Creating: {},
	// running → running records new upstreams (a restart outside sandwake).
	Running: {Creating, Running, Paused, Stopped, Killed, Expired, Error},
	// stopped → paused only when reconcile adopts a container that was
	// started and paused outside sandwake.
	Paused:  {Running, Stopped},
	Stopped: {Running, Paused, Error, Killed},
	Killed:  {Creating, Running, Paused, Stopped, Error},
	Expired: {Running, Paused, Stopped, Killed, Error},
	// error → error records a retry that failed again, with its new cause.
	Error: {Creating, Running, Paused, Stopped, Killed, Expired, Error},
}

// AllowedFrom returns the states a sandbox may enter state to from.
func AllowedFrom(to State) []State { return allowedFrom[to] }

// CanTransition reports whether from → to is in the transition table.
func CanTransition(from, to State) bool { return slices.Contains(allowedFrom[to], from) }

// Resident reports whether a sandbox in state s holds memory on the host
// (running or paused): what max_resident counts.
func Resident(s State) bool { return s == Running || s == Paused }

// ValidState reports whether s names a state.
func ValidState(s State) bool { return slices.Contains(States, s) }
