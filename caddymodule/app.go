package caddymodule

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/distribution/reference"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	core "github.com/sandwake/sandwake/engine"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/preview"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the "sandwake" Caddy app: the settings of the sandbox farm and the
// engine behind them (store, Docker runtime, lifecycle manager). The engine
// lives in a package-level pool keyed by storage directory, opened at the
// first Start and closed when the last config using it is cleaned up, so a
// config reload keeps the same store open, never drops a pending wake, and
// `caddy validate` (which provisions without starting) takes no lock.
type App struct {
	// Domain is the preview domain: sandboxes are served at
	// s-<id>-<port>.preview.<domain>. Default: localhost.
	Domain string `json:"domain,omitempty"`
	// Storage is the directory of the embedded Badger store. Default:
	// "sandwake" in Caddy's data directory.
	Storage string `json:"storage,omitempty"`
	// Engine is the container engine sandboxes run on: Docker (the
	// default) or Kubernetes (see EngineConfig). Changing it needs a
	// restart. Default: docker.
	Engine *EngineConfig `json:"engine,omitempty"`
	// DockerHost is the Docker Engine address, e.g. unix:///var/run/docker.sock.
	// Default: DOCKER_HOST, else the local socket. Changing it needs a restart.
	DockerHost string `json:"docker_host,omitempty"`
	// UpstreamMode is how the gateway reaches a sandbox: "direct" (at the
	// sandbox's own address on its network; nothing is published on the
	// host, no userland proxy runs), "published" (each port published on
	// 127.0.0.1: for an engine the gateway cannot route to, a remote
	// DOCKER_HOST or Docker Desktop's VM) or "network" (the gateway dials
	// s-<id>:<port> on Network; the gateway runs in a container). Default:
	// direct where the engine is local and the sandbox bridge is in the
	// gateway's network namespace, else published (readyz and the start-up
	// log say which, and why). Changing it needs a restart.
	UpstreamMode string `json:"upstream_mode,omitempty"`
	// Network is the Docker network of upstream mode "network".
	Network string `json:"network,omitempty"`
	// IdlePause: a running sandbox with no request, no open connection and
	// no keepalive for this long is paused (memory kept, wakes in
	// milliseconds). 0 turns the tier off. Default: 3m.
	IdlePause *caddy.Duration `json:"idle_pause,omitempty"`
	// IdleStop: a running or paused sandbox idle this long is stopped
	// (memory freed, disk kept). 0 turns the tier off. Default: 30m.
	IdleStop *caddy.Duration `json:"idle_stop,omitempty"`
	// MinResident: a sandbox active or woken this recently is not evicted
	// to make room for another wake (memory pressure excepted), so that
	// sandboxes in use between two requests are not stopped and woken
	// again. 0 turns it off. Default: 30s.
	MinResident *caddy.Duration `json:"min_resident,omitempty"`
	// CapacityWait is how long a wake waits for room when every resident
	// sandbox is in use before it is refused (503 capacity). 0: no wait.
	// Default: 10s.
	CapacityWait *caddy.Duration `json:"capacity_wait,omitempty"`
	// MaxLifetime: a sandbox this old is expired: container removed, volume
	// kept. 0 means never. Default: 0.
	MaxLifetime caddy.Duration `json:"max_lifetime,omitempty"`
	// ExpiredWake is what a request to an expired sandbox does: "recreate"
	// (from the stored spec, same volume) or "refuse" (the expired page).
	// Default: recreate.
	ExpiredWake string `json:"expired_wake,omitempty"`
	// MinFreeMemory is the host memory to keep available, as a size
	// ("512MiB") or a share of the host's memory ("10%"). Below it, idle
	// sandboxes are stopped (paused ones first) and wakes evict before
	// starting. "0" turns it off. Default: 10%.
	MinFreeMemory string `json:"min_free_memory,omitempty"`
	// ReapInterval is how often idle tiers, expiry and pressure are
	// checked. Default: 10s.
	ReapInterval caddy.Duration `json:"reap_interval,omitempty"`
	// ReconcileInterval is how often the store is compared with Docker in
	// full (Docker's event stream corrects single sandboxes at once in
	// between). Default: 30s.
	ReconcileInterval caddy.Duration `json:"reconcile_interval,omitempty"`
	// Orphans is what to do with containers labelled as sandwake's that
	// have no record: "keep" (count and log) or "remove". Default: keep.
	Orphans string `json:"orphans,omitempty"`
	// Webhooks receive events as signed POSTs, from a durable outbox
	// (at least once, in order, retried with backoff, across restarts).
	Webhooks []WebhookConfig `json:"webhooks,omitempty"`
	// WebhookMaxAge: an event still undelivered this long after it happened
	// is dropped and logged. Default: 24h.
	WebhookMaxAge caddy.Duration `json:"webhook_max_age,omitempty"`
	// EventRetention is how long the event log (API history, resumable
	// event stream) keeps events. Default: 7 days.
	EventRetention caddy.Duration `json:"event_retention,omitempty"`
	// PreviewSecret signs preview tokens of private sandboxes; placeholders
	// are replaced. Default: a random secret generated once and kept in the
	// store. Changing it revokes every token.
	PreviewSecret string `json:"preview_secret,omitempty"`
	// RobotsTxt answers /robots.txt on every preview host with
	// "Disallow: /" (no wake). Default: true.
	RobotsTxt *bool `json:"robots_txt,omitempty"`
	// XRobotsTag is sent on every preview response; "off" sends none.
	// Default: noindex.
	XRobotsTag string `json:"x_robots_tag,omitempty"`
	// NoWakeUserAgents are case-insensitive substrings of User-Agents that
	// never wake a sandbox (they get the page, status 503). Default: common
	// crawlers, link previewers and uptime monitors. ["off"] turns it off.
	NoWakeUserAgents []string `json:"no_wake_user_agents,omitempty"`
	// WakeRate caps request-triggered wakes per second, across all
	// sandboxes; past it, 503 + Retry-After. 0 means no cap. Default: 20.
	WakeRate *float64 `json:"wake_rate,omitempty"`
	// WakeBurst is how many wakes may start at once above WakeRate.
	// Default: 2×WakeRate.
	WakeBurst int `json:"wake_burst,omitempty"`
	// WakeRatePerClient caps the wakes one client address (an IPv6 /64;
	// behind trusted_proxies, the real client) may cause per second, with
	// a burst of twice that; past it, 429 + Retry-After. 0 means no cap.
	// Default: 5.
	WakeRatePerClient *float64 `json:"wake_rate_per_client,omitempty"`
	// MaxHeldPerClient caps the requests of one client held through wakes
	// at once; past it, 429 too_many_held. 0 means no cap. Default: 1000.
	MaxHeldPerClient *int `json:"max_held_per_client,omitempty"`
	// MaxOpenPerSandbox caps the exchanges (requests, websockets, event
	// streams) open to one sandbox at once; past it, requests wait their
	// turn, first in first out, up to hold_timeout, then get 503 busy. It
	// lets a wake storm through as fast as the app answers instead of all
	// at once, and keeps Docker's per-port proxy (which gives up on every
	// connection of its port when it runs out of file descriptors) far
	// from its limit. 0 means no cap. Default: 256.
	MaxOpenPerSandbox *int `json:"max_open_per_sandbox,omitempty"`
	// WakeTimeout bounds one wake: start plus readiness. Default: 60s.
	WakeTimeout caddy.Duration `json:"wake_timeout,omitempty"`
	// HoldTimeout is how long a non-browser request to a sleeping sandbox is
	// held waiting for the wake before it gets 503 + Retry-After. Default: 60s.
	HoldTimeout caddy.Duration `json:"hold_timeout,omitempty"`
	// MaxResident caps running + paused sandboxes; a wake beyond it is
	// refused with 503. 0 means no cap. Default: 200.
	MaxResident *int `json:"max_resident,omitempty"`
	// KeepaliveMax caps one keepalive request. Default: 24h.
	KeepaliveMax caddy.Duration `json:"keepalive_max,omitempty"`
	// ActivityFlush is how often last-active times kept in memory are
	// written to the store, in one batch. Default: 5s.
	ActivityFlush caddy.Duration `json:"activity_flush,omitempty"`
	// PreviewURL is how preview URLs look to users, with * standing for
	// the sandbox's label s-<id>-<port>; the API shows each sandbox's URLs
	// with it. Default: https://*.preview.<domain>, or
	// http://*.preview.localhost for the localhost domain.
	PreviewURL string `json:"preview_url,omitempty"`
	// Labels are added to every container and volume sandwake creates, and
	// narrow what it considers its own: several gateways (or test runs) can
	// share one Docker engine.
	Labels map[string]string `json:"labels,omitempty"`
	// StopTimeout is how long a stop waits for a sandbox's app to exit
	// before Docker kills it. Default: 10s.
	StopTimeout caddy.Duration `json:"stop_timeout,omitempty"`
	// Instance names this gateway on a Docker engine it may share with
	// others (staging and production, CI runs, other tools): its containers,
	// volumes carry sandwake.instance=<name>, and it acts only on objects
	// that carry its name. 1-63 characters of [a-z0-9_.-], starting with a
	// letter or digit. Default: a random name generated once and kept in the
	// store; once kept, a different configured name is refused.
	Instance string `json:"instance,omitempty"`
	// SandboxNetwork is the Docker bridge network sandboxes join (upstream
	// mode published), created when missing with inter-container
	// communication off, so that sandboxes cannot reach each other (ports
	// stay published on 127.0.0.1 only), and with a subnet of its own in
	// which sandwake gives each sandbox a fixed address (its egress rules
	// are keyed by it). Each instance has its own. Default:
	// sandwake-<instance>.
	SandboxNetwork string `json:"sandbox_network,omitempty"`
	// SandboxSubnet is the IPv4 subnet of the sandbox network when
	// sandwake creates it, e.g. 10.99.0.0/16. Each sandbox holds one
	// address from create to destroy, so the subnet bounds how many
	// sandboxes the instance keeps (a /16 holds about 61,000). Default: one
	// the engine picks from its address pools.
	SandboxSubnet string `json:"sandbox_subnet,omitempty"`
	// Egress is the egress policy of a sandbox whose create names none:
	// "public" (the internet, but not the host, private networks,
	// link-local and cloud metadata, loopback, multicast or reserved
	// ranges), "none" (no outbound connection but what its allow list
	// names; lookups of other names answered NXDOMAIN) or "learn" (public,
	// recording what it uses for a lock). Default: public.
	Egress string `json:"egress,omitempty"`
	// EgressAllow is the allow list of a sandbox created without one
	// (names or addresses, as a create's egress.allow). Applied at create
	// only: a PATCH or a lock replaces it.
	EgressAllow []string `json:"egress_allow,omitempty"`
	// Activity is what keeps a sandbox whose spec names none from idle
	// pause and stop: "inbound" (preview requests; the default) or "any"
	// (also its own established outbound connections and lookups, up to
	// ActiveMax past its last request).
	Activity string `json:"activity,omitempty"`
	// ActiveMax bounds how long outbound work alone keeps a sandbox under
	// activity any awake, from its last request. Default: 1h.
	ActiveMax caddy.Duration `json:"active_max,omitempty"`
	// EgressUnenforced runs sandboxes without the egress firewall (with
	// engine kubernetes: without their NetworkPolicies): policies are
	// stored and shown, nothing enforces them, and readyz, the dashboard
	// and the start-up log say so. Without it, a gateway that cannot
	// install the firewall (no CAP_NET_ADMIN in the engine host's network
	// namespace, a remote engine) starts no sandbox. Default: false.
	EgressUnenforced bool `json:"egress_unenforced,omitempty"`
	// EgressDeny are CIDRs a public policy denies beyond the fixed private,
	// link-local, loopback, multicast and reserved ranges and the host's
	// own addresses.
	EgressDeny []string `json:"egress_deny,omitempty"`
	// EgressAllowPrivate are the denied destinations a sandbox's allow
	// list may open, each "addr[/bits][:port][/tcp|/udp]" (an internal
	// package mirror, say): an allow entry inside a denied range is
	// refused (400) unless one of these covers it.
	EgressAllowPrivate []string `json:"egress_allow_private,omitempty"`
	// EgressDNS are the resolvers sandwake's DNS forwarder asks for the
	// sandboxes (which reach no other DNS server). Default: the
	// nameservers of the host's resolv.conf.
	EgressDNS []string `json:"egress_dns,omitempty"`
	// Templates are named sandbox shapes creates can use
	// ("template":"web"), each with an optional warm pool of containers
	// made ahead of any create.
	Templates []TemplateConfig `json:"templates,omitempty"`
	// PoolMemoryMax caps the memory the warm pools' idle containers hold
	// together (the memory_mb of their templates), as a size ("4GiB") or a
	// share of the host ("10%"). Default: no cap.
	PoolMemoryMax string `json:"pool_memory_max,omitempty"`

	// DefaultMemory is the memory limit of a sandbox whose spec gives none,
	// as a size ("512MiB"); "0" leaves them unlimited. Default: 512MiB.
	DefaultMemory string `json:"default_memory,omitempty"`
	// User is the user sandboxes run as when their spec names none:
	// uid[:gid] or a user name the images know. Default: each image's own
	// USER (root for most images: set this for images that run as
	// another user).
	User string `json:"user,omitempty"`
	// ReadonlyRootfs makes every sandbox's root filesystem read-only unless
	// its spec says otherwise: the workspace and a tmpfs /tmp of TmpMB
	// stay writable. Default: false.
	ReadonlyRootfs bool `json:"readonly_rootfs,omitempty"`
	// TmpMB bounds the tmpfs /tmp of a read-only sandbox, in MiB. Default:
	// 64. Changing it needs a restart.
	TmpMB int64 `json:"tmp_mb,omitempty"`
	// DefaultCPUs is the CPU limit, in cores, of a sandbox whose spec gives
	// none. Default: 0 (unlimited).
	DefaultCPUs float64 `json:"default_cpus,omitempty"`
	// DefaultDisk is the disk quota (workspace and writable layer) of a
	// sandbox whose spec gives no disk_mb, as a size ("10GiB"); "0" leaves
	// them without one. Default: 10GiB.
	DefaultDisk string `json:"default_disk,omitempty"`
	// DiskCheckInterval is how often the disk watchdog measures running
	// sandboxes with a quota. Default: 30s. Changing it needs a restart.
	DiskCheckInterval caddy.Duration `json:"disk_check_interval,omitempty"`
	// Nofile is each sandbox's open-file limit (soft and hard). Default:
	// 4096. Changing it needs a restart.
	Nofile int64 `json:"nofile,omitempty"`
	// Runtime is the OCI runtime of a sandbox whose spec names none (runsc
	// for gVisor, kata-runtime, …); the engine must have it, or the
	// gateway does not start. Default: the engine's default (runc).
	Runtime string `json:"runtime,omitempty"`
	// Pull is the image pull policy for creates: "missing" pulls an image
	// the engine lacks, "never" refuses it (422 image_missing), "always"
	// pulls at every create. Pulls come only from AllowedRegistries.
	// Default: missing.
	Pull string `json:"pull,omitempty"`
	// AllowedRegistries are the registries images may be pulled from, as
	// image references name them (ghcr.io, registry.example.com:5000,
	// docker.io for Docker Hub). Default: none, so that a create cannot
	// make the engine pull from wherever an image name points (internal
	// hosts included): only images already on the engine are used.
	AllowedRegistries []string `json:"allowed_registries,omitempty"`
	// AllowedImages, when set, are the only images creates may use: globs
	// (path.Match) on the image reference as given or normalised, e.g.
	// "registry.example.com/previews/*" or "node:*". Default: any.
	AllowedImages []string `json:"allowed_images,omitempty"`
	// MaxEventStreams caps the event streams (/.well-known/sandwake/events,
	// which any visitor may open) open on preview hosts at once; past it,
	// 503 + Retry-After, and the warming page polls the status instead.
	// 0 means no cap. Default: 1000 (about 50 MiB of streams).
	MaxEventStreams *int `json:"max_event_streams,omitempty"`
	// MaxEventStreamsPerClient caps the preview hosts' event streams of one
	// client address (Caddy's client IP: the forwarded address only behind
	// trusted_proxies; an IPv6 address counts as its /64); past it, 429 +
	// Retry-After. 0 means no cap. Default: 16.
	MaxEventStreamsPerClient *int `json:"max_event_streams_per_client,omitempty"`
	// Cluster joins this gateway to a cluster of nodes sharing one sandbox
	// catalog in etcd (see ClusterConfig). Default: none, a single host.
	Cluster *ClusterConfig `json:"cluster,omitempty"`

	storageDir    string
	minFreeBytes  uint64
	defaultMemMB  int64
	defaultDiskMB int64
	// templates are Templates, normalised; poolMemoryMaxMB PoolMemoryMax.
	templates       []lifecycle.Template
	poolMemoryMaxMB int64
	hooks           []lifecycle.Webhook
	previewSecret   string
	egress          egressSettings
	started         bool
	// eng is set by Start; a pointer so that App stays copyable (Caddy
	// copies module values).
	eng    *atomic.Pointer[engine]
	logger *zap.Logger
}

// WebhookConfig is one webhook receiver.
type WebhookConfig struct {
	// URL receives one POST per event; placeholders such as
	// {env.SANDWAKE_WEBHOOK_URL} are replaced, for URLs that carry a
	// secret. Logs show only its scheme and host. Redirects are not
	// followed.
	URL string `json:"url"`
	// Secret signs deliveries (Sandwake-Signature); placeholders such as
	// {env.SANDWAKE_WEBHOOK_SECRET} are replaced. Required.
	Secret string `json:"secret,omitempty"`
	// Events limits deliveries to these types (sandbox.killed, …); empty
	// means all.
	Events []string `json:"events,omitempty"`
	// RetryMin is the first retry delay, doubled (with jitter) up to 5m.
	// Default: 1s.
	RetryMin caddy.Duration `json:"retry_min,omitempty"`
}

// Defaults of the App.
const (
	DefaultDomain            = "localhost"
	DefaultWakeTimeout       = lifecycle.DefaultWakeTimeout
	DefaultHoldTimeout       = 60 * time.Second
	DefaultMaxResident       = 200
	DefaultKeepaliveMax      = lifecycle.DefaultKeepaliveMax
	DefaultActivityFlush     = 5 * time.Second
	DefaultStopTimeout       = core.DefaultStopTimeout
	DefaultIdlePause         = 3 * time.Minute
	DefaultIdleStop          = 30 * time.Minute
	DefaultMinResident       = 30 * time.Second
	DefaultCapacityWait      = 10 * time.Second
	DefaultReapInterval      = 10 * time.Second
	DefaultReconcileInterval = 30 * time.Second
	DefaultMinFreeMemory     = "10%"
	DefaultWebhookMaxAge     = lifecycle.DefaultWebhookMaxAge
	DefaultEventRetention    = 7 * 24 * time.Hour
	DefaultWakeRate          = 20.0
	DefaultWakeRatePerClient = 5.0
	DefaultDisk              = "10GiB"
	DefaultDiskCheckInterval = lifecycle.DefaultDiskInterval
	DefaultMaxHeldPerClient  = 1000
	DefaultMaxOpenPerSandbox = 256
	DefaultMemory            = "512MiB"
)

// parseMemory reads a size ("512MiB", "2GB") or a share of the host's total
// memory ("10%") as bytes.
func parseMemory(s string) (uint64, error) {
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		p, err := strconv.ParseFloat(pct, 64)
		if err != nil || p < 0 || p >= 100 {
			return 0, fmt.Errorf("%q is not a percentage below 100", s)
		}
		total, err := lifecycle.HostMemTotal()
		if err != nil {
			return 0, err
		}
		return uint64(float64(total) * p / 100), nil
	}
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size like 512MiB or a share like 10%%", s)
	}
	return n, nil
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "sandwake",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision fills defaults. It opens nothing: see Start.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger().Named("sandwake")
	a.eng = new(atomic.Pointer[engine])
	if a.Domain == "" {
		a.Domain = DefaultDomain
	}
	setDuration(&a.WakeTimeout, DefaultWakeTimeout)
	setDuration(&a.HoldTimeout, DefaultHoldTimeout)
	setDuration(&a.KeepaliveMax, DefaultKeepaliveMax)
	setDuration(&a.ActivityFlush, DefaultActivityFlush)
	setDuration(&a.StopTimeout, DefaultStopTimeout)
	if a.IdlePause == nil {
		d := caddy.Duration(DefaultIdlePause)
		a.IdlePause = &d
	}
	if a.IdleStop == nil {
		d := caddy.Duration(DefaultIdleStop)
		a.IdleStop = &d
	}
	if a.MinResident == nil {
		d := caddy.Duration(DefaultMinResident)
		a.MinResident = &d
	}
	if a.CapacityWait == nil {
		d := caddy.Duration(DefaultCapacityWait)
		a.CapacityWait = &d
	}
	if a.RobotsTxt == nil {
		on := true
		a.RobotsTxt = &on
	}
	if a.XRobotsTag == "" {
		a.XRobotsTag = "noindex"
	}
	if a.NoWakeUserAgents == nil {
		a.NoWakeUserAgents = gateway.DefaultNoWakeUserAgents
	} else if len(a.NoWakeUserAgents) == 1 && a.NoWakeUserAgents[0] == "off" {
		a.NoWakeUserAgents = []string{}
	}
	if a.WakeRate == nil {
		r := DefaultWakeRate
		a.WakeRate = &r
	}
	if a.WakeBurst == 0 {
		a.WakeBurst = max(1, int(2**a.WakeRate))
	}
	if a.WakeRatePerClient == nil {
		r := DefaultWakeRatePerClient
		a.WakeRatePerClient = &r
	}
	if a.MaxHeldPerClient == nil {
		n := DefaultMaxHeldPerClient
		a.MaxHeldPerClient = &n
	}
	if a.MaxOpenPerSandbox == nil {
		n := DefaultMaxOpenPerSandbox
		a.MaxOpenPerSandbox = &n
	}
	a.previewSecret = caddy.NewReplacer().ReplaceKnown(a.PreviewSecret, "")
	if a.PreviewSecret != "" && len(a.previewSecret) < 16 {
		return errors.New("sandwake: preview_secret must be at least 16 characters once placeholders are replaced")
	}
	setDuration(&a.ReapInterval, DefaultReapInterval)
	setDuration(&a.WebhookMaxAge, DefaultWebhookMaxAge)
	setDuration(&a.EventRetention, DefaultEventRetention)
	repl := caddy.NewReplacer()
	a.hooks = a.hooks[:0]
	for _, w := range a.Webhooks {
		target := repl.ReplaceKnown(w.URL, "")
		if target == "" {
			return fmt.Errorf("sandwake: webhook %s: the URL is empty once placeholders are replaced (is the variable set?)", w.URL)
		}
		secret := repl.ReplaceKnown(w.Secret, "")
		if secret == "" {
			return fmt.Errorf("sandwake: webhook %s: secret is empty (set it; placeholders must resolve)", webhookName(w.URL, target))
		}
		a.hooks = append(a.hooks, lifecycle.Webhook{
			URL: target, Secret: []byte(secret), Events: w.Events,
			RetryMin: time.Duration(w.RetryMin), MaxAge: time.Duration(a.WebhookMaxAge),
		})
	}
	setDuration(&a.ReconcileInterval, DefaultReconcileInterval)
	if a.ExpiredWake == "" {
		a.ExpiredWake = lifecycle.ExpiredWakeRecreate
	}
	if a.Orphans == "" {
		a.Orphans = "keep"
	}
	if err := a.provisionEngine(); err != nil {
		return err
	}
	if a.MinFreeMemory == "" {
		a.MinFreeMemory = DefaultMinFreeMemory
	}
	minFree, err := parseMemory(a.MinFreeMemory)
	if err != nil {
		return fmt.Errorf("sandwake: min_free_memory: %w", err)
	}
	a.minFreeBytes = minFree
	if a.MaxResident == nil {
		n := DefaultMaxResident
		a.MaxResident = &n
	}
	if a.MaxEventStreams == nil {
		n := gateway.DefaultMaxEventStreams
		a.MaxEventStreams = &n
	}
	if a.MaxEventStreamsPerClient == nil {
		n := gateway.DefaultMaxEventStreamsPerClient
		a.MaxEventStreamsPerClient = &n
	}
	if a.PreviewURL == "" {
		a.PreviewURL = "https://*.preview." + a.Domain
		if a.Domain == DefaultDomain {
			a.PreviewURL = "http://*.preview." + a.Domain
		}
	}
	if err := a.provisionEgress(); err != nil {
		return err
	}
	if err := a.provisionTemplates(); err != nil {
		return err
	}
	if a.Pull == "" {
		a.Pull = core.PullMissing
	}
	if a.DefaultMemory == "" {
		a.DefaultMemory = DefaultMemory
	}
	if strings.HasSuffix(a.DefaultMemory, "%") {
		return fmt.Errorf("sandwake: default_memory %q: want a size such as 512MiB", a.DefaultMemory)
	}
	defMem, err := parseMemory(a.DefaultMemory)
	if err != nil {
		return fmt.Errorf("sandwake: default_memory: %w", err)
	}
	a.defaultMemMB = int64(defMem >> 20)
	if a.DefaultDisk == "" {
		a.DefaultDisk = DefaultDisk
	}
	if strings.HasSuffix(a.DefaultDisk, "%") {
		return fmt.Errorf("sandwake: default_disk %q: want a size such as 10GiB", a.DefaultDisk)
	}
	defDisk, err := parseMemory(a.DefaultDisk)
	if err != nil {
		return fmt.Errorf("sandwake: default_disk: %w", err)
	}
	if a.defaultDiskMB = int64(defDisk >> 20); defDisk > 0 && (a.defaultDiskMB < 1 || a.defaultDiskMB > lifecycle.MaxDiskMB) {
		return fmt.Errorf("sandwake: default_disk %s is outside 1 MiB to 16 TiB", a.DefaultDisk)
	}
	setDuration(&a.DiskCheckInterval, DefaultDiskCheckInterval)
	if defMem > 0 && (a.defaultMemMB < lifecycle.MinMemoryMB || a.defaultMemMB > lifecycle.MaxMemoryMB) {
		return fmt.Errorf("sandwake: default_memory %s is outside %d MiB to 1 TiB", a.DefaultMemory, lifecycle.MinMemoryMB)
	}
	a.storageDir = a.Storage
	if a.storageDir == "" {
		a.storageDir = filepath.Join(caddy.AppDataDir(), "sandwake")
	}
	abs, err := filepath.Abs(a.storageDir)
	if err != nil {
		return fmt.Errorf("sandwake: storage %q: %w", a.storageDir, err)
	}
	a.storageDir = abs
	if err := checkStorageDir(a.storageDir); err != nil {
		return err
	}
	if a.Cluster != nil {
		if err := a.Cluster.provision(a); err != nil {
			return err
		}
	}
	return nil
}

// checkStorageDir fails when the storage directory cannot exist: the path,
// or the nearest part of it that exists, is not a directory. It runs at
// Provision, before any server of the config listens, so such a config is
// refused at once rather than after its servers started and had to be shut
// down again (the store itself is opened, and the directory made, at Start).
// It creates nothing: caddy validate provisions too.
func checkStorageDir(dir string) error {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		switch {
		case err == nil && fi.IsDir():
			return nil
		case err == nil:
			return fmt.Errorf("sandwake: opening the store: storage %s: %s is not a directory", dir, p)
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("sandwake: opening the store: storage %s: %w", dir, err)
		}
		if parent := filepath.Dir(p); parent == p {
			return nil
		}
	}
}

func setDuration(d *caddy.Duration, def time.Duration) {
	if *d == 0 {
		*d = caddy.Duration(def)
	}
}

// Validate checks the settings.
func (a *App) Validate() error {
	if err := a.validateIsolation(); err != nil {
		return err
	}
	if !preview.ValidDomain(a.Domain) {
		return fmt.Errorf("sandwake: domain %q is not a DNS name", a.Domain)
	}
	if strings.Count(a.PreviewURL, "*") != 1 {
		return fmt.Errorf("sandwake: preview_url %q must contain one * (the sandbox label)", a.PreviewURL)
	}
	if u, err := url.Parse(strings.Replace(a.PreviewURL, "*", "s-x-1", 1)); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("sandwake: preview_url %q is not an http(s) URL", a.PreviewURL)
	}
	switch a.UpstreamMode {
	case "", core.UpstreamDirect, core.UpstreamPublished:
		if a.Network != "" {
			return errors.New("sandwake: network is set but upstream_mode is not network")
		}
	case core.UpstreamNetwork:
		if a.Network == "" {
			return errors.New("sandwake: upstream_mode network needs a network name")
		}
	default:
		return fmt.Errorf("sandwake: upstream_mode %q is not direct, published or network", a.UpstreamMode)
	}
	if err := a.checkBounds(); err != nil {
		return fmt.Errorf("sandwake: %w", err)
	}
	switch a.ExpiredWake {
	case lifecycle.ExpiredWakeRecreate, lifecycle.ExpiredWakeRefuse:
	default:
		return fmt.Errorf("sandwake: expired_wake %q is not recreate or refuse", a.ExpiredWake)
	}
	switch a.Orphans {
	case "keep", "remove":
	default:
		return fmt.Errorf("sandwake: orphans %q is not keep or remove", a.Orphans)
	}
	if a.Cluster != nil {
		if err := a.Cluster.validate(); err != nil {
			return err
		}
	}
	if a.Instance != "" && !lifecycle.ValidInstance(a.Instance) {
		return fmt.Errorf("sandwake: instance %q: want 1-63 characters of [a-z0-9_.-] starting with a letter or digit", a.Instance)
	}
	if a.SandboxNetwork != "" && !lifecycle.ValidInstance(a.SandboxNetwork) {
		return fmt.Errorf("sandwake: sandbox_network %q: want 1-63 characters of [a-z0-9_.-] starting with a letter or digit", a.SandboxNetwork)
	}
	switch a.Pull {
	case core.PullMissing, core.PullNever, core.PullAlways:
	default:
		return fmt.Errorf("sandwake: pull %q is not missing, never or always", a.Pull)
	}
	for _, r := range a.AllowedRegistries {
		if !validRegistry(r) {
			return fmt.Errorf("sandwake: allowed_registries %q is not a registry host (such as ghcr.io, registry.example.com:5000 or docker.io)", r)
		}
	}
	for _, p := range a.AllowedImages {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return fmt.Errorf("sandwake: allowed_images %q is not a pattern", p)
		}
	}
	seen := map[string]bool{}
	for i, w := range a.hooks {
		name := webhookName(a.Webhooks[i].URL, w.URL)
		u, err := url.Parse(w.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("sandwake: webhook %s is not an http(s) URL", name)
		}
		if seen[w.URL] {
			return fmt.Errorf("sandwake: webhook %s is configured twice", name)
		}
		seen[w.URL] = true
		for _, typ := range w.Events {
			if !validEventType(typ) {
				return fmt.Errorf("sandwake: webhook %s: %q is not an event type (sandbox.<state>, sandbox.destroyed, sandbox.purged)", name, typ)
			}
		}
	}
	return nil
}

// webhookName is how messages name a webhook: as configured when that is a
// placeholder, else its URL cut to scheme and host (a receiver's secret is
// often in the path).
func webhookName(configured, resolved string) string {
	if configured != resolved {
		return configured
	}
	return lifecycle.RedactURL(resolved)
}

// validRegistry reports whether r is a registry host as image references
// name it: a DNS name or address, optionally :port.
func validRegistry(r string) bool {
	named, err := reference.ParseNormalizedNamed(r + "/x")
	return err == nil && reference.Domain(named) == r
}

// engine is the shared runtime of the configs with one storage directory:
// the running gateway, and the cluster block it joined with (membership is
// fixed until a restart).
type engine struct {
	*gateway.Gateway
	// clusterCfg is the cluster block the engine joined with, nil on a
	// single host.
	clusterCfg *ClusterConfig
	// engineCfg is the engine option the engine opened with (fixed until
	// a restart).
	engineCfg EngineConfig
}

// Destruct closes the gateway when the last config using it is cleaned up
// (caddy.Destructor).
func (e *engine) Destruct() error { return e.Close() }

// engines holds the running engines, keyed by storage directory.
var engines = caddy.NewUsagePool()

// Start opens (or shares) the engine and publishes this config's settings to
// it. The boot reconcile runs before the gate is marked ready.
func (a *App) Start() error {
	val, loaded, err := engines.LoadOrNew(a.storageDir, func() (caddy.Destructor, error) {
		return openEngine(a)
	})
	if err != nil {
		return err
	}
	e := val.(*engine)
	if diff := clusterChanges(e.clusterCfg, a.Cluster); loaded && diff != "" {
		// Joining, leaving or changing the cluster needs a new engine;
		// running on with the old membership while the config says
		// otherwise would be silent: the reload is refused.
		if _, err := engines.Delete(a.storageDir); err != nil {
			a.logger.Error("releasing the engine", zap.Error(err))
		}
		return fmt.Errorf("sandwake: %s: cluster membership is set when sandwake starts; restart Caddy to apply it (the running config is kept)", diff)
	}
	if diff := engineChanges(e.engineCfg, a.Engine); loaded && diff != "" {
		if _, err := engines.Delete(a.storageDir); err != nil {
			a.logger.Error("releasing the engine", zap.Error(err))
		}
		return fmt.Errorf("sandwake: %s: the engine is chosen when sandwake starts; restart Caddy to apply it (the running config is kept)", diff)
	}
	if h, ok := e.Core.Host(); loaded && ok && a.Runtime != "" && !slices.Contains(h.Runtimes, a.Runtime) {
		if _, err := engines.Delete(a.storageDir); err != nil {
			a.logger.Error("releasing the engine", zap.Error(err))
		}
		return fmt.Errorf("sandwake: runtime %q is not installed on the Docker engine (it has: %s); the running config is kept", a.Runtime, strings.Join(h.Runtimes, ", "))
	}
	a.started = true
	if loaded && (e.DockerHost != a.DockerHost || e.UpstreamMode != a.UpstreamMode || e.Network != a.Network) {
		a.logger.Warn("docker_host, upstream_mode and network changes take effect after a restart",
			zap.String("storage", a.storageDir))
	}
	e.apply(a)
	a.eng.Store(e)
	return nil
}

// Stop is a no-op: the engine stays up while any config uses it (see Cleanup),
// so a reload never interrupts a wake.
func (a *App) Stop() error { return nil }

// Cleanup releases this config's hold on the engine; the last one closes it.
func (a *App) Cleanup() error {
	if !a.started {
		return nil
	}
	a.started = false
	_, err := engines.Delete(a.storageDir)
	return err
}

// sandwakeApp finds the sandwake app for a module of the same config (the
// app is created with defaults when the config has no sandwake option).
func sandwakeApp(ctx caddy.Context, module string) (*App, error) {
	app, err := ctx.App("sandwake")
	if err != nil {
		return nil, fmt.Errorf("%s: loading sandwake app: %w", module, err)
	}
	return app.(*App), nil
}

// gateway returns the running gateway, nil before Start: what the
// handlers serve from.
func (a *App) gateway() *gateway.Gateway {
	if e := a.engine(); e != nil {
		return e.Gateway
	}
	return nil
}

// engine returns the running engine, nil before Start.
func (a *App) engine() *engine {
	if a.eng == nil {
		return nil
	}
	return a.eng.Load()
}

func openEngine(a *App) (*engine, error) {
	log := a.logger
	// The engine exists before its manager: the manager's hooks, fixed at
	// construction, point into it (routes is set before anything can
	// change, the loops start after).
	e := &engine{Gateway: &gateway.Gateway{
		Log: log, DockerHost: a.DockerHost, UpstreamMode: a.UpstreamMode, Network: a.Network,
		Guard: gateway.NewWakeGuard(), Streams: gateway.NewStreamLimiter(), Clients: gateway.NewClientLimits(),
	}}
	mcfg := lifecycle.Config{
		OnChange:          e.Changed,
		OnWake:            e.ObserveWake,
		OnReap:            gateway.ObserveReap,
		OnDelivery:        gateway.ObserveDelivery,
		OnReconcile:       gateway.ObserveCorrection,
		OnDiskQuota:       gateway.ObserveDiskQuota,
		OnPoolClaim:       gateway.ObservePoolClaim,
		DiskInterval:      time.Duration(a.DiskCheckInterval),
		ActivityFlush:     time.Duration(a.ActivityFlush),
		ReapInterval:      time.Duration(a.ReapInterval),
		ReconcileInterval: time.Duration(a.ReconcileInterval),
		WatchEvents:       true,
		OrphansRemove:     a.Orphans == "remove",
		DefaultMemoryMB:   a.defaultMemMB,
		AllowedImages:     a.AllowedImages,
		Logger:            log,
	}
	kind, kube := a.Engine.options()
	mcfg.Egress = a.egress.config
	switch {
	case kind == core.KindKubernetes && a.EgressUnenforced:
		kube.Egress = core.KubernetesEgressUnenforced
	case kind == core.KindKubernetes:
		// The runtime enforces policies itself (a NetworkPolicy per
		// sandbox): the kernel firewall does not apply to pods.
	default:
		mcfg.Firewall = a.egress.firewall(log)
	}
	mcfg.Apply(a.managerSettings())
	c, err := core.Open(core.Options{
		Kind:              kind,
		Kubernetes:        kube,
		Dir:               a.storageDir,
		Instance:          a.Instance,
		DockerHost:        a.DockerHost,
		UpstreamMode:      a.UpstreamMode,
		Network:           a.Network,
		StopTimeout:       time.Duration(a.StopTimeout),
		Labels:            a.Labels,
		SandboxNetwork:    a.SandboxNetwork,
		SandboxSubnet:     a.egress.subnet,
		Pull:              a.Pull,
		AllowedRegistries: a.AllowedRegistries,
		Nofile:            a.Nofile,
		TmpMB:             a.TmpMB,
		Logger:            log,
		Manager:           mcfg,
	})
	if err != nil {
		return nil, fmt.Errorf("sandwake: %w", err)
	}
	e.Core, e.Mgr, e.Instance = c, c.Manager, c.Instance
	if a.Engine != nil {
		e.engineCfg = *a.Engine
	}
	mgr, instance := c.Manager, c.Instance
	e.Routes = gateway.NewRouteCache(mgr)
	if err := e.joinCluster(a); err != nil {
		c.Close()
		return nil, err
	}
	e.StoredSecret, err = c.Secret("preview", func() ([]byte, error) {
		b := make([]byte, 32)
		_, err := rand.Read(b)
		return b, err
	})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("sandwake: %w", err)
	}
	if err := c.Start(context.Background()); err != nil {
		c.Close()
		return nil, fmt.Errorf("sandwake: %w", err)
	}
	// The boot reconcile runs before the gate serves, so that no request
	// is routed on a record Docker contradicts. With Docker down it is not
	// fatal: pages and the API work, wakes answer 503 until it is back, and
	// the periodic reconcile catches up.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// How sandboxes are reached is settled before the boot reconcile,
	// which moves sandboxes made with published ports to their own
	// addresses when the mode is direct.
	e.Upstreams, e.UpstreamsWhy = c.Upstreams(ctx)
	log.Info("upstream mode: "+e.Upstreams, zap.String("why", e.UpstreamsWhy))
	if stats, err := mgr.Reconcile(ctx); err != nil {
		log.Warn("boot reconcile failed (docker unreachable?)", zap.Error(err))
	} else {
		log.Info("boot reconcile done", zap.String("instance", instance), zap.Int("records", stats.Records), zap.Int("containers", stats.Containers),
			zap.Any("corrections", stats.Corrections), zap.Int("orphans", len(stats.Orphans)))
		if e.StoreWarning = c.StoreWarning(stats); e.StoreWarning != "" {
			log.Error("store lost? "+e.StoreWarning, zap.Strings("containers", stats.Orphans))
		}
	}
	e.EgressUnenforced = a.EgressUnenforced
	if e.Core.Kind() == core.KindKubernetes {
		e.EgressCaveat = "a NetworkPolicy per sandbox, enforced only where the cluster's network plugin enforces NetworkPolicy"
	}
	e.Isolation = gateway.IsolationReport(c)
	if !e.Isolation.OK {
		log.Warn("sandbox isolation: " + e.Isolation.Detail)
	}
	e.reportEgress(a)
	if !a.EgressUnenforced {
		// Entries lost with the host's tables (a reboot) are back before
		// the first request, not at the first periodic reconcile.
		if _, err := mgr.SyncFirewall(ctx); err != nil {
			log.Warn("egress firewall sync at start", zap.Error(err))
		}
	}
	if err := e.startCluster(); err != nil {
		e.Cluster.Close()
		c.Close()
		return nil, err
	}
	e.Ready.Store(true)
	gateway.SetCurrent(e.Gateway)
	log.Info("sandwake engine started", zap.String("storage", a.storageDir))
	return e, nil
}

// apply publishes a config's settings to the running engine.
func (e *engine) apply(a *App) {
	secret := []byte(a.previewSecret)
	if len(secret) == 0 {
		secret = e.StoredSecret
	}
	var xrt []string
	if a.XRobotsTag != "off" {
		xrt = []string{a.XRobotsTag}
		xrt = xrt[:1:1]
	}
	e.Current.Store(&gateway.Settings{
		Domain: a.Domain, HoldTimeout: time.Duration(a.HoldTimeout), MaxOpen: int64(*a.MaxOpenPerSandbox), PreviewURL: a.PreviewURL,
		PreviewSecret: secret, RobotsTxt: *a.RobotsTxt, XRobotsTag: xrt,
	})
	e.Guard.Configure(a.NoWakeUserAgents, *a.WakeRate, a.WakeBurst)
	e.Clients.Configure(*a.WakeRatePerClient, max(1, int(2**a.WakeRatePerClient)), *a.MaxHeldPerClient)
	e.Streams.Configure(*a.MaxEventStreams, *a.MaxEventStreamsPerClient)
	e.Mgr.Reconfigure(a.managerSettings())
	e.Mgr.SetWebhooks(a.hooks)
	e.applyCluster(a)
}

// managerSettings are the engine settings a reload may change, as the
// Manager takes them at start (Config.Apply) and on reload (Reconfigure).
func (a *App) managerSettings() lifecycle.Settings {
	return lifecycle.Settings{
		WakeTimeout:     time.Duration(a.WakeTimeout),
		KeepaliveMax:    time.Duration(a.KeepaliveMax),
		MaxResident:     *a.MaxResident,
		IdlePause:       time.Duration(*a.IdlePause),
		IdleStop:        time.Duration(*a.IdleStop),
		MinResident:     time.Duration(*a.MinResident),
		CapacityWait:    time.Duration(*a.CapacityWait),
		MaxLifetime:     time.Duration(a.MaxLifetime),
		ExpiredWake:     a.ExpiredWake,
		Activity:        a.Activity,
		ActiveMax:       time.Duration(a.ActiveMax),
		MinFreeMemory:   a.minFreeBytes,
		EventRetention:  time.Duration(a.EventRetention),
		Isolation:       lifecycle.Isolation{User: a.User, ReadonlyRootfs: a.ReadonlyRootfs, Runtime: a.Runtime, CPUs: a.DefaultCPUs, DiskMB: a.defaultDiskMB},
		Templates:       a.templates,
		PoolMemoryMaxMB: a.poolMemoryMaxMB,
	}
}

// validEventType reports whether typ names an event sandwake emits.
func validEventType(typ string) bool {
	if typ == lifecycle.EventDestroyed || typ == lifecycle.EventPurged || typ == lifecycle.EventEgress || typ == lifecycle.EventPoolFilled {
		return true
	}
	state, ok := strings.CutPrefix(typ, "sandbox.")
	return ok && lifecycle.ValidState(lifecycle.State(state))
}

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
	_ caddy.Destructor   = (*engine)(nil)
)
