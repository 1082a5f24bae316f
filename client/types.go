package client

import (
	"strconv"
	"time"
)

// The types below are the management API's JSON, shared by the server (the
// sandwake_api handler) and this client so the two cannot drift apart.
// Field order is the order the API writes.

// Sandbox is a sandbox as the API shows it. Environment values are never
// shown, only their keys.
type Sandbox struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Error is the last failure's message, for sandboxes in state error.
	Error   string   `json:"error,omitempty"`
	Image   string   `json:"image"`
	Cmd     []string `json:"cmd,omitempty"`
	EnvKeys []string `json:"env_keys"`
	Ports   []int    `json:"ports"`
	// URLs maps each port, in decimal, to its preview URL.
	URLs          map[string]string `json:"urls"`
	MemoryMB      int64             `json:"memory_mb,omitempty"`
	CPUs          float64           `json:"cpus,omitempty"`
	WorkspacePath string            `json:"workspace_path"`
	ReadyPath     string            `json:"ready_path,omitempty"`
	// IdlePause, IdleStop and MaxLifetime are Go durations ("3m0s"), empty
	// when the sandbox follows the gateway's settings.
	IdlePause   string            `json:"idle_pause,omitempty"`
	IdleStop    string            `json:"idle_stop,omitempty"`
	MaxLifetime string            `json:"max_lifetime,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Access      string            `json:"access"`
	// PublicCard: a private sandbox shows its link card to unfurl bots.
	PublicCard      bool       `json:"public_card,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	LastActiveAt    time.Time  `json:"last_active_at"`
	StateSince      time.Time  `json:"state_since"`
	ExpiresAt       *time.Time `json:"expires_at,omitempty"`
	KeepaliveUntil  *time.Time `json:"keepalive_until,omitempty"`
	VerifiedAt      *time.Time `json:"verified_at,omitempty"`
	OpenConnections int64      `json:"open_connections"`
	// Node is the node holding the sandbox (the instance name on a single
	// host).
	Node string `json:"node"`
	// Egress is the sandbox's egress policy.
	Egress *Egress `json:"egress,omitempty"`
	// Activity is what keeps the sandbox from idle pause and stop:
	// "inbound" (preview requests) or "any" (also its own outbound
	// connections and lookups); empty when it follows the gateway's.
	Activity string `json:"activity,omitempty"`
	// Address is the sandbox's fixed address on the sandbox network.
	Address string `json:"address,omitempty"`
	// EgressDenied counts the packets its egress policy refused (read from
	// the firewall's counters, at most a few seconds old).
	EgressDenied uint64 `json:"egress_denied"`
	// User is the user the sandbox's processes run as ("": the image's).
	User string `json:"user,omitempty"`
	// ReadonlyRootfs tells a read-only root filesystem.
	ReadonlyRootfs bool `json:"readonly_rootfs"`
	// CapAdd are the capabilities given back on top of the sandbox minimum.
	CapAdd []string `json:"cap_add,omitempty"`
	// Runtime is the container's OCI runtime ("": the engine's default).
	Runtime string `json:"runtime,omitempty"`
	// DiskMB is the sandbox's disk quota in MiB (0: none).
	DiskMB int64 `json:"disk_mb,omitempty"`
	// DiskUsedMB is what it had written at the disk watchdog's last
	// measure (while running or paused, with a quota).
	DiskUsedMB *int64 `json:"disk_used_mb,omitempty"`
	// Services are the sandbox's services (containers beside the app,
	// sharing its address), by name; absent for a sandbox without any.
	Services map[string]ServiceView `json:"services,omitempty"`
	// GroupMemoryMB, for a sandbox with services, is the memory of the
	// whole group (the app's memory_mb and its services'): what admission
	// and placement count.
	GroupMemoryMB int64 `json:"group_memory_mb,omitempty"`
	// Template is the template the sandbox was created from.
	Template string `json:"template,omitempty"`
	// Pool, in the answer of a create from a template only, says whether
	// a warm pool container was claimed.
	Pool *PoolOutcome `json:"pool,omitempty"`
}

// ServiceView is one of a sandbox's (or a template's) services as the API
// shows it. Like the app's, its environment values are never shown.
type ServiceView struct {
	// State is the service's container state while its group runs
	// ("running", "exited", …), otherwise the sandbox's own state
	// (paused, stopped, …); empty in a template.
	State string `json:"state,omitempty"`
	// MemoryMB is the service's memory limit in MiB.
	MemoryMB int64 `json:"memory_mb"`
	// DiskUsedMB is what the service had written at the disk watchdog's
	// last measure, when known.
	DiskUsedMB int64 `json:"disk_used_mb,omitempty"`
	// Image is the service's container image.
	Image string `json:"image"`
	// Ready is its readiness probe, "tcp:<port>" or "http:<port><path>".
	Ready string `json:"ready,omitempty"`
	// DependsOn are the services started (and ready) before it.
	DependsOn []string `json:"depends_on,omitempty"`
}

// PoolOutcome is what a create from a template did with its warm pool:
// Hit when it claimed an idle container, else the Reason it created cold
// (empty, bypass, id, env, failed, no_pool).
type PoolOutcome struct {
	Hit    bool   `json:"hit"`
	Reason string `json:"reason,omitempty"`
}

// Template is a named sandbox shape of the gateway, with its warm pool
// (GET /v1/templates).
type Template struct {
	Name          string            `json:"name"`
	Image         string            `json:"image"`
	Cmd           []string          `json:"cmd,omitempty"`
	EnvKeys       []string          `json:"env_keys"`
	Ports         []int             `json:"ports"`
	MemoryMB      int64             `json:"memory_mb,omitempty"`
	CPUs          float64           `json:"cpus,omitempty"`
	WorkspacePath string            `json:"workspace_path"`
	ReadyPath     string            `json:"ready_path,omitempty"`
	IdlePause     string            `json:"idle_pause,omitempty"`
	IdleStop      string            `json:"idle_stop,omitempty"`
	MaxLifetime   string            `json:"max_lifetime,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Access        string            `json:"access"`
	// PublicCard: a private sandbox shows its link card to unfurl bots.
	PublicCard bool `json:"public_card,omitempty"`
	// Egress is the template's egress policy, absent when it follows the
	// gateway's.
	Egress *Egress `json:"egress,omitempty"`
	// Activity is the template's activity ("inbound" or "any"), empty
	// when it follows the gateway's.
	Activity string `json:"activity,omitempty"`
	// Services are the template's services, by name (without a state):
	// each sandbox of the template, and each pool container, is the whole
	// group.
	Services map[string]ServiceView `json:"services,omitempty"`
	// Pool is the template's warm pool; absent for a token bound to a
	// tenant, since its figures are the whole gateway's.
	Pool *PoolStatus `json:"pool,omitempty"`
}

// PoolStatus is a template's warm pool: its settings and figures.
type PoolStatus struct {
	// Idle containers of the template's current shape, ready to claim;
	// Filling being made.
	Idle    int    `json:"idle"`
	Filling int    `json:"filling"`
	MinIdle int    `json:"min_idle"`
	MaxIdle int    `json:"max_idle"`
	State   string `json:"state"`
	MaxAge  string `json:"max_age,omitempty"`
	// Hits and Misses count creates from the template that did and did
	// not claim a container; MissReasons splits the misses.
	Hits        uint64            `json:"hits"`
	Misses      uint64            `json:"misses"`
	MissReasons map[string]uint64 `json:"miss_reasons,omitempty"`
	Refills     uint64            `json:"refills"`
	// LastError is the last fill's failure, while the refill backs off.
	LastError string `json:"last_error,omitempty"`
}

// TemplateList is the answer of GET /v1/templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// Egress is a sandbox's egress policy: "public" (the internet but not the
// host, private networks or cloud metadata), "none" (no outbound
// connection) or "learn" (public, recording what the sandbox uses for
// LockEgress), with allow entries that open exactly what they list on top
// and, under public and learn, deny entries that refuse what they list.
// An entry is a DNS name "name[:port][/tcp|/udp]" (a bare name opens every
// port over tcp and udp; "*.name" matches its subdomains, not the name) or
// an address "addr[/bits][:port][/tcp|/udp]" (tcp by default).
type Egress struct {
	// Policy is public, none or learn; empty on a create follows the
	// gateway's default.
	Policy string `json:"policy,omitempty"`
	// Allow lists what the sandbox may reach on top of the policy.
	// A nil list is left out (a create then takes the gateway's
	// egress_allow); an empty one is sent as [] (no entry).
	Allow []string `json:"allow,omitzero"`
	// Deny lists what a public or learn policy refuses although it would
	// let it through; deny wins over allow.
	Deny []string `json:"deny,omitzero"`
}

// EgressLog is the answer of GET /v1/sandboxes/{id}/egress: what a
// sandbox tried outbound, newest first and bounded.
type EgressLog struct {
	ID     string `json:"id"`
	Policy string `json:"policy"`
	// Decisions are its connections, aggregated by destination.
	Decisions []EgressDecision `json:"decisions"`
	// Lookups are the names it looked up through sandwake's forwarder.
	Lookups []EgressLookup `json:"lookups"`
	// Learned, under the learn policy only, is the allow list a lock
	// (POST /v1/sandboxes/{id}/egress/lock) would make of it.
	Learned []string `json:"learned,omitzero"`
}

// EgressDecision is the connections of a sandbox to one destination.
type EgressDecision struct {
	// First and Last are when the first and the latest were seen.
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
	// Addr is the destination's IPv4 address; Port is 0 for ICMP.
	Addr string `json:"addr"`
	Port int    `json:"port,omitempty"`
	// Proto is tcp, udp or icmp.
	Proto string `json:"proto"`
	// Name is the name the address was looked up as, when it was looked
	// up through the forwarder.
	Name string `json:"name,omitempty"`
	// Allowed tells whether the policy let it through.
	Allowed bool `json:"allowed"`
	// Count is the connections (allowed) or packets (denied) seen.
	Count uint64 `json:"count"`
}

// Destination is the decision's "addr:port/proto" ("addr/icmp" without a
// port).
func (d *EgressDecision) Destination() string {
	if d.Port == 0 {
		return d.Addr + "/" + d.Proto
	}
	return d.Addr + ":" + strconv.Itoa(d.Port) + "/" + d.Proto
}

// EgressLookup is one name a sandbox looked up through the forwarder.
type EgressLookup struct {
	Name string `json:"name"`
	// Addrs is the latest answer's IPv4 addresses.
	Addrs []string `json:"addrs,omitempty"`
	// Allowed tells whether the policy lets the sandbox reach the answer.
	Allowed bool      `json:"allowed"`
	Count   uint64    `json:"count"`
	Last    time.Time `json:"last"`
}

// FirstURL is the preview URL of the sandbox's first port, "" when it has
// none.
func (s *Sandbox) FirstURL() string {
	if len(s.Ports) == 0 {
		return ""
	}
	return s.URLs[strconv.Itoa(s.Ports[0])]
}

// SandboxList is the answer of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	// Next is the cursor of the next page of a paged list (limit or
	// cursor given); empty on the last page and for an unpaged list.
	Next string `json:"next,omitempty"`
	// Counts, in a paged list for a token that sees every sandbox, counts
	// the sandboxes of the gateway by state (all of them, not the page).
	Counts map[string]int `json:"counts,omitempty"`
}

// ListOptions filter GET /v1/sandboxes.
type ListOptions struct {
	// State lists only the sandboxes in this state; empty lists all.
	State string
	// Labels lists only the sandboxes carrying every one of them.
	Labels map[string]string
	// Limit, when above 0, asks for a page of at most Limit sandboxes
	// (up to 1000) after Cursor (the Next of the page before).
	Limit  int
	Cursor string
}

// CreateRequest is the body of POST /v1/sandboxes. The durations are
// strings like "90s" or "30m"; nil leaves the gateway's setting, "0" turns
// the tier off.
type CreateRequest struct {
	ID string `json:"id"`
	// Template names a template of the gateway: the sandbox gets its
	// fields, and a container of its warm pool when one is idle. Beside
	// it, only id, labels, access, egress, env and the idle tiers may be
	// given (anything else needs Pool "bypass").
	Template string `json:"template,omitempty"`
	// Pool is "prefer" (default: claim, else create cold), "require"
	// (claim, else 503 pool_empty) or "bypass" (create cold).
	Pool          string            `json:"pool,omitempty"`
	Image         string            `json:"image"`
	Cmd           []string          `json:"cmd"`
	Env           map[string]string `json:"env"`
	Ports         []int             `json:"ports"`
	MemoryMB      int64             `json:"memory_mb"`
	CPUs          float64           `json:"cpus"`
	WorkspacePath string            `json:"workspace_path"`
	ReadyPath     string            `json:"ready_path"`
	ReadyMode     string            `json:"ready_mode"`
	IdlePause     *string           `json:"idle_pause"`
	IdleStop      *string           `json:"idle_stop"`
	MaxLifetime   *string           `json:"max_lifetime"`
	Labels        map[string]string `json:"labels"`
	Access        string            `json:"access"`
	// PublicCard: a private sandbox shows its link card to unfurl bots.
	PublicCard bool    `json:"public_card,omitempty"`
	Egress     *Egress `json:"egress,omitempty"`
	// Activity is what keeps the sandbox from idle pause and stop:
	// "inbound" (preview requests) or "any" (also its own outbound
	// connections and lookups, up to the gateway's active_max past the
	// last request). "": the gateway's activity.
	Activity string `json:"activity,omitempty"`
	// User runs the sandbox as uid[:gid] or a user name of the image;
	// "" follows the gateway's user option, then the image.
	User string `json:"user,omitempty"`
	// ReadonlyRootfs makes the root filesystem read-only (nil: the
	// gateway's readonly_rootfs).
	ReadonlyRootfs *bool `json:"readonly_rootfs,omitempty"`
	// CapAdd gives back capabilities of Docker's default set that
	// sandboxes drop: AUDIT_WRITE, MKNOD, NET_RAW, SETFCAP, SETPCAP,
	// SYS_CHROOT.
	CapAdd []string `json:"cap_add,omitempty"`
	// Runtime is the engine's OCI runtime, e.g. runsc ("": the gateway's
	// runtime option, then the engine's default).
	Runtime string `json:"runtime,omitempty"`
	// DiskMB is the disk quota in MiB: past it the sandbox is stopped
	// (reason disk_quota). 0: the gateway's default_disk.
	DiskMB int64 `json:"disk_mb,omitempty"`
	// Services are containers beside the app, by name (1-20 of a-z, 0-9
	// and '-', not app or net): they share the app's network namespace
	// (the app reaches a service on localhost) and address, and are
	// woken, paused, stopped, pooled and destroyed with it. A wake starts
	// them in depends_on order, each ready before the next and all before
	// the app.
	Services map[string]Service `json:"services,omitempty"`
}

// Service is one service of a create request or template: a container
// beside the app, with the create fields that make sense for it.
type Service struct {
	// Image is the service's container image (required).
	Image string `json:"image"`
	// Cmd replaces the image's command.
	Cmd []string `json:"cmd,omitempty"`
	// Env are its environment variables.
	Env map[string]string `json:"env,omitempty"`
	// MemoryMB is its memory limit in MiB. 0: the gateway's
	// default_memory. The group's memory is the app's and its services'.
	MemoryMB int64 `json:"memory_mb,omitempty"`
	// CPUs is its CPU limit, in cores (0: none).
	CPUs float64 `json:"cpus,omitempty"`
	// DiskMB is its disk quota in MiB (0: none of its own; the engine's
	// storage bounds it).
	DiskMB int64 `json:"disk_mb,omitempty"`
	// Ready is its readiness probe, run inside the group's network
	// namespace (a service listening on 127.0.0.1 only is found):
	// "tcp:<port>" or "http:<port><path>". Empty: ready once started.
	Ready string `json:"ready,omitempty"`
	// WorkspacePath is where its own volume is mounted. Default:
	// /workspace.
	WorkspacePath string `json:"workspace_path,omitempty"`
	// DependsOn are the services started (and ready) before this one.
	DependsOn []string `json:"depends_on,omitempty"`
}

// Patch is the body of PATCH /v1/sandboxes/{id}: the fields to change, nil
// for those to keep.
type Patch struct {
	Access *string `json:"access"`
	// PublicCard turns a private sandbox's link card on or off.
	PublicCard  *bool   `json:"public_card,omitempty"`
	IdlePause   *string `json:"idle_pause"`
	IdleStop    *string `json:"idle_stop"`
	MaxLifetime *string `json:"max_lifetime"`
	// Egress replaces the egress policy (policy, allow and deny
	// together: a list left out is emptied); in force on a running
	// sandbox when the answer arrives, cutting connections it forbids.
	Egress *Egress `json:"egress,omitempty"`
}

// Identity is the answer of GET /v1/whoami: what the caller's token may do.
type Identity struct {
	// Scope is read, operate or admin.
	Scope string `json:"scope"`
	// Labels, when set, are the only sandboxes the token sees (those
	// carrying every one of them) and the labels it stamps on creates.
	Labels map[string]string `json:"labels,omitempty"`
}

// KeepaliveRequest is the body of POST /v1/sandboxes/{id}/keepalive.
type KeepaliveRequest struct {
	// For is how long to keep the sandbox from the idle tiers, a duration
	// like "10m"; the gateway caps it at its keepalive_max.
	For string `json:"for"`
}

// PurgeResult is the answer of POST /v1/sandboxes/{id}/purge.
type PurgeResult struct {
	// FreedBytes is the size of the volume removed.
	FreedBytes int64 `json:"freed_bytes"`
}

// TokenRequest is the body of POST /v1/sandboxes/{id}/tokens. Both fields
// are optional.
type TokenRequest struct {
	// TTL is the token's lifetime, a duration up to 90 days. Default: 1h.
	TTL string `json:"ttl"`
	// Subject is recorded in the token, at most 200 characters without |.
	Subject string `json:"subject"`
}

// Token is the answer of POST /v1/sandboxes/{id}/tokens: a preview token
// and a link that carries it.
type Token struct {
	ExpiresAt time.Time `json:"expires_at"`
	Token     string    `json:"token"`
	URL       string    `json:"url"`
}

// Event is a sandbox event, as GET /v1/events streams it and
// GET /v1/sandboxes/{id}/history lists it. A transition has From and To;
// sandbox.destroyed and sandbox.purged have no To.
type Event struct {
	ID        uint64    `json:"id"`
	Type      string    `json:"type"`
	SandboxID string    `json:"sandbox_id"`
	From      string    `json:"from,omitempty"`
	To        string    `json:"to,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	At        time.Time `json:"at"`
	// Incarnation and Labels are the sandbox's: an id destroyed and
	// created again is another incarnation.
	Incarnation string            `json:"incarnation,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// Node is the node of another node's sandbox (a cluster's merged
	// stream).
	Node string `json:"node,omitempty"`
	// Denials, on sandbox.egress_denied_summary, counts one window of
	// the sandbox's refused egress past what was logged event by event.
	Denials *DenialSummary `json:"denials,omitempty"`
}

// Event types of refused egress: at most 60 sandbox.egress_denied a
// minute per sandbox (one per destination), then one
// sandbox.egress_denied_summary for the minute.
const (
	EventEgressDenied        = "sandbox.egress_denied"
	EventEgressDeniedSummary = "sandbox.egress_denied_summary"
)

// DenialSummary is the Denials of a sandbox.egress_denied_summary event.
type DenialSummary struct {
	// From and Until bound the window (a minute).
	From  time.Time `json:"from"`
	Until time.Time `json:"until"`
	// Logged is how many sandbox.egress_denied events the window made.
	Logged int `json:"logged"`
	// Suppressed is how many denials were not logged as events.
	Suppressed uint64 `json:"suppressed"`
	// Destinations is how many distinct destinations those were of
	// (estimated past 256: DestinationsEstimated).
	Destinations          int  `json:"destinations"`
	DestinationsEstimated bool `json:"destinations_estimated,omitempty"`
	// Top are the suppressed destinations denied most, at most five.
	Top []DeniedCount `json:"top,omitempty"`
}

// DeniedCount is a destination ("addr:port/proto [name]") and how often
// it was denied.
type DeniedCount struct {
	Destination string `json:"destination"`
	Count       uint64 `json:"count"`
}

// History is the answer of GET /v1/sandboxes/{id}/history.
type History struct {
	Events []Event `json:"events"`
	// Next, in a paged history (limit or after given), is the id of the
	// page's last event, to pass as After for the next page; 0 on the
	// last page and for an unpaged history.
	Next uint64 `json:"next,omitempty"`
}

// HistoryOptions page GET /v1/sandboxes/{id}/history.
type HistoryOptions struct {
	// Limit, when above 0, asks for a page of at most Limit events (up
	// to 1000; 100 when only After is given) after the event id After
	// (the Next of the page before).
	Limit int
	After uint64
}

// Readiness is the answer of GET /v1/readyz, with status 200 when Ready and
// 503 otherwise.
type Readiness struct {
	Ready bool `json:"ready"`
	// Checks maps store, docker and boot_reconcile to "ok" or what is wrong.
	Checks   map[string]string `json:"checks"`
	Instance string            `json:"instance,omitempty"`
	// Node is the answering node's name in a cluster.
	Node          string `json:"node,omitempty"`
	LastReconcile string `json:"last_reconcile,omitempty"`
}

// ErrorResponse is the body of every error the API answers:
// {"error":{"code":"…","message":"…"}}.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is the inside of an ErrorResponse.
type ErrorBody struct {
	// Code is a stable, machine-readable word: not_found, invalid,
	// unauthorized, conflict, capacity, unavailable, …
	Code string `json:"code"`
	// Message is a sentence for people.
	Message string `json:"message"`
	// State is the sandbox's state, on errors about one.
	State string `json:"state,omitempty"`
}
