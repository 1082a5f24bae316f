package lifecycle

import (
	"net/netip"
	"time"
)

// This file holds the sandbox's data as it is stored: the spec it is
// (re)created from, its record and the entries of the event log. The Store
// persists them as JSON; the field names are the stored format.

// Spec is everything needed to (re)create a sandbox's container. It is kept for
// the sandbox's whole life so that a removed container can be recreated with the
// same image, settings and volume.
type Spec struct {
	// Image is the Docker image reference the container runs.
	Image string `json:"image"`
	// Cmd overrides the image's command when set.
	Cmd []string `json:"cmd,omitempty"`
	// Env holds environment variables passed to the container. Values are never
	// shown by the API.
	Env map[string]string `json:"env,omitempty"`
	// Ports are the container ports the sandbox serves, in declaration order.
	// The first one is used for the readiness probe.
	Ports []int `json:"ports"`
	// MemoryMB is the container's memory limit in MiB (0: engine default).
	MemoryMB int64 `json:"memory_mb,omitempty"`
	// CPUs is the container's CPU limit in cores (0: unlimited).
	CPUs float64 `json:"cpus,omitempty"`
	// PidsLimit caps the number of processes in the container (0: engine default).
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// WorkspacePath is where the sandbox's volume is mounted.
	WorkspacePath string `json:"workspace_path"`
	// ReadyPath, when set, makes readiness require an HTTP answer below 500 from
	// this path instead of any HTTP answer.
	ReadyPath string `json:"ready_path,omitempty"`
	// ReadyMode is "http" (default) or "tcp" for ports that do not speak HTTP.
	ReadyMode string `json:"ready_mode,omitempty"`
	// IdlePause, IdleStop and MaxLifetime override the global settings when
	// not nil; a zero value turns the tier off.
	IdlePause   *time.Duration `json:"idle_pause,omitempty"`
	IdleStop    *time.Duration `json:"idle_stop,omitempty"`
	MaxLifetime *time.Duration `json:"max_lifetime,omitempty"`
	// Labels are free-form labels owned by the caller.
	Labels map[string]string `json:"labels,omitempty"`
	// Access is "public" (default) or "private".
	Access string `json:"access,omitempty"`
	// PublicCard gives a private sandbox a link card: its app's page title
	// and description, og:* and twitter:* tags, read from page loads, shown
	// to unfurl bots without a token (and without a wake). A public
	// sandbox always has one; a private one only when its owner says so.
	PublicCard bool `json:"public_card,omitempty"`
	// Egress is the sandbox's outbound network policy; a zero value (a
	// record made before egress policies) follows the gateway's default.
	Egress Egress `json:"egress,omitzero"`
	// Activity is what keeps the sandbox from idle pause and stop:
	// ActivityInbound (preview requests; the default) or ActivityAny
	// (also its own outbound connections and lookups, up to the
	// gateway's active_max past the last request). "": the gateway's.
	Activity string `json:"activity,omitempty"`
	// Services are containers beside the app that share its network
	// namespace and address (services.go), by name.
	Services map[string]Service `json:"services,omitempty"`
	// User runs the sandbox's processes as uid[:gid] (or a user name the
	// image knows); "" follows the gateway's default_user, and when that is
	// empty too the image's own USER.
	User string `json:"user,omitempty"`
	// ReadonlyRootfs mounts the root filesystem read-only: the workspace
	// and a size-bounded tmpfs /tmp stay writable. Nil (a record made
	// before the option) follows the gateway's readonly_rootfs.
	ReadonlyRootfs *bool `json:"readonly_rootfs,omitempty"`
	// CapAdd gives back capabilities of Docker's default set that every
	// sandbox drops (AddableCapabilities), for the apps that need one.
	CapAdd []string `json:"cap_add,omitempty"`
	// DiskMB bounds what the sandbox may write, its workspace and its
	// container's writable layer together, in MiB (0: no quota). Over it
	// the disk watchdog stops the sandbox with reason disk_quota; where
	// the storage driver supports one, the writable layer also gets a hard
	// quota of this size.
	DiskMB int64 `json:"disk_mb,omitempty"`
	// Runtime is the engine's OCI runtime for the container (runsc for
	// gVisor, kata-runtime, …); "" follows the gateway's runtime, and when
	// that is empty the engine's default.
	Runtime string `json:"runtime,omitempty"`

	// Address is the sandbox's fixed address on the sandbox network, set
	// by the Manager from the record before the runtime creates the
	// container (not stored here: Record.Address is).
	Address netip.Addr `json:"-"`
	// Incarnation is the record's incarnation, set by the Manager before
	// the runtime creates the container (not stored here:
	// Record.Incarnation is): a workspace volume the create makes records
	// it with Labels, as its owner (see VolumeOwner).
	Incarnation string `json:"-"`
	// Pool marks a container made for a template's warm pool (labels on
	// the container, not stored here).
	Pool PoolTag `json:"-"`
}

// PoolTag is what a pool container carries of its template.
type PoolTag struct {
	Template string
	Key      string
}

// Record is the stored state of one sandbox.
type Record struct {
	ID   string `json:"id"`
	Spec Spec   `json:"spec"`

	State  State  `json:"state"`
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`

	CreatedAt      time.Time `json:"created_at"`
	LastActiveAt   time.Time `json:"last_active_at"`
	StateSince     time.Time `json:"state_since"`
	StoppedAt      time.Time `json:"stopped_at,omitzero"`
	ExpiresAt      time.Time `json:"expires_at,omitzero"`
	KeepaliveUntil time.Time `json:"keepalive_until,omitzero"`
	VerifiedAt     time.Time `json:"verified_at,omitzero"`

	// ContainerID is the Docker id of the sandbox's current container, empty
	// when it has none.
	ContainerID string `json:"container_id,omitempty"`
	// Incarnation is a random value drawn at every create of this id: a
	// sandbox destroyed and created again under the same id is a new
	// incarnation. Preview tokens are bound to it, and a record without one
	// was made before incarnations existed (see lifecycle's ownership rules).
	Incarnation string `json:"incarnation,omitempty"`
	// TokenGeneration is the generation of the sandbox's preview tokens;
	// revoking every token of the sandbox increments it.
	TokenGeneration uint64 `json:"token_generation,omitempty"`

	// Address is the sandbox's fixed address on the sandbox network, held
	// from create to destroy; its egress rules are keyed by it. Zero for
	// a runtime without a network of its own, or a record made before
	// addresses existed (given one at its next wake).
	Address netip.Addr `json:"address,omitzero"`

	// Upstreams maps each declared port to the address it is reachable at
	// ("127.0.0.1:49153" when published, "s-<id>:8080" on a network). Host
	// ports can change on every start, so they are re-read each time.
	Upstreams map[int]string `json:"upstreams,omitempty"`

	// PublishedPorts: the sandbox's container publishes its ports on the
	// host (made in upstream mode published). Where the gateway dials
	// sandboxes directly, such a container is made again (volume kept) at
	// its next start, without them.
	PublishedPorts bool `json:"published_ports,omitempty"`

	// DNSForwarded: the sandbox's container resolves through the egress
	// firewall's forwarder. One made before the forwarder existed asks the
	// host's resolvers, reached (under public and learn) until it is made
	// again (volume kept) at its next start.
	DNSForwarded bool `json:"dns_forwarded,omitempty"`

	// Cards are the link cards of the app's pages, by port (cards.go).
	Cards map[int]Card `json:"cards,omitempty"`

	// EgressLearned is what the sandbox used under the learn policy, as
	// Learned lists it, kept by the activity flush so that a learn spanning
	// a gateway restart loses nothing (the egress log itself is in
	// memory). Cleared when the policy leaves learn.
	EgressLearned []string `json:"egress_learned,omitempty"`

	// Phases are where the wake that returned this record spent its time
	// (set on a wake's result only; not stored).
	Phases *WakePhases `json:"-"`

	// ServiceStates are the states of the sandbox's services as the
	// engine last showed them (its group running), by name.
	ServiceStates map[string]ContainerState `json:"service_states,omitempty"`

	// Template is the template the sandbox was created from, "" for none.
	Template string `json:"template,omitempty"`
}

// Event is one entry of the append-only event log. IDs increase by one with
// every event and are never reused.
type Event struct {
	ID        uint64    `json:"id"`
	Type      string    `json:"type"`
	SandboxID string    `json:"sandbox_id"`
	From      State     `json:"from,omitempty"`
	To        State     `json:"to,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	At        time.Time `json:"at"`
	// Incarnation and Labels are those of the sandbox the event is of
	// (an id destroyed and created again is another incarnation, perhaps
	// another tenant's): history and event streams show a token only the
	// events whose labels it matches. Empty on events logged before they
	// were recorded, which only an unscoped token sees.
	Incarnation string            `json:"incarnation,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// Denials counts a window's refused egress past what was logged
	// event by event (EventEgressDeniedSummary only).
	Denials *DenialSummary `json:"denials,omitempty"`
}

// DenialSummary is what a sandbox.egress_denied_summary event counts of
// one window of a sandbox's refused egress.
type DenialSummary struct {
	// From and Until bound the window.
	From  time.Time `json:"from"`
	Until time.Time `json:"until"`
	// Logged is how many sandbox.egress_denied events the window made.
	Logged int `json:"logged"`
	// Suppressed is how many denials (reports of a refused destination,
	// at most one a second per destination) were not logged as events.
	Suppressed uint64 `json:"suppressed"`
	// Destinations is how many distinct destinations the suppressed
	// denials were of: exact up to 256, estimated past it
	// (DestinationsEstimated).
	Destinations          int  `json:"destinations"`
	DestinationsEstimated bool `json:"destinations_estimated,omitempty"`
	// Top are the suppressed destinations denied most often, at most
	// five, most first (among the first 256 distinct ones).
	Top []DeniedCount `json:"top,omitempty"`
}

// DeniedCount is a destination ("addr:port/proto [name]", as an
// egress_denied event's reason) and how often it was denied.
type DeniedCount struct {
	Destination string `json:"destination"`
	Count       uint64 `json:"count"`
}

// EventType names the event of a transition into state to.
func EventType(to State) string { return "sandbox." + string(to) }

// Event types that are not a state.
const (
	EventDestroyed = "sandbox.destroyed"
	EventPurged    = "sandbox.purged"
	// EventEgress: the sandbox's egress policy changed; the event's reason
	// is the new policy (public or none).
	EventEgress = "sandbox.egress_changed"
	// EventEgressDenied: the sandbox tried a destination its policy
	// refuses; the reason is "addr:port/proto" with the name it was
	// looked up as, when it was. The firewall bounds them (its
	// EgressObserver's OnDenied; egress/denials.go: one per destination
	// and 60 per sandbox a minute); past that, one
	// EventEgressDeniedSummary counts the rest.
	EventEgressDenied = "sandbox.egress_denied"
	// EventEgressDeniedSummary: the sandbox's refused egress in one window
	// went past what is logged event by event; the event's Denials counts
	// what was not logged, and its reason says it in a line.
	EventEgressDeniedSummary = "sandbox.egress_denied_summary"
	// EventServiceFailed: a service of the sandbox did not start or
	// become ready, failing its create or wake; the reason is
	// "<service>: <what happened>".
	EventServiceFailed = "sandbox.service_failed"
	// EventPoolFilled: a container was made for a template's warm pool
	// (sandbox_id is the id it will have once claimed, reason the
	// template). A claim is the sandbox's creating event, reason
	// "pool_claim".
	EventPoolFilled = "pool.filled"
)
