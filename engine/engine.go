package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
	"github.com/sandwake/sandwake/store"
)

// Values of Options.UpstreamMode and Options.Pull, the default sandbox
// network and stop timeout (see lifecycle/docker).
const (
	UpstreamAuto          = docker.UpstreamAuto
	UpstreamDirect        = docker.UpstreamDirect
	UpstreamPublished     = docker.UpstreamPublished
	UpstreamNetwork       = docker.UpstreamNetwork
	PullMissing           = docker.PullMissing
	PullNever             = docker.PullNever
	PullAlways            = docker.PullAlways
	DefaultSandboxNetwork = docker.DefaultSandboxNetwork
	// DefaultStopTimeout is a container stop's grace period when unset.
	DefaultStopTimeout = docker.DefaultStopTimeout
)

// hostSizeTimeout bounds the engine-info call Open makes.
const hostSizeTimeout = 5 * time.Second

// Options configure Open.
type Options struct {
	// Dir is the directory of the Badger store. Required unless InMemory.
	Dir string
	// InMemory keeps the store in memory (tests).
	InMemory bool
	// Instance is the configured instance name. "": the name kept in the
	// store, or a new random one ("gw-…") for a new store.
	Instance string

	// DockerHost is the Docker Engine address. Default: the environment
	// (DOCKER_HOST), else the local socket.
	DockerHost string
	// UpstreamMode is UpstreamAuto (default: direct where the engine is
	// local and its bridge reachable, else published), UpstreamDirect,
	// UpstreamPublished or UpstreamNetwork.
	UpstreamMode string
	// Network is the network the gateway shares with sandboxes in network
	// mode.
	Network string
	// StopTimeout is the grace period of a container stop. Default: 10s.
	StopTimeout time.Duration
	// Labels are added to every container and volume made.
	Labels map[string]string
	// SandboxNetwork is the network sandboxes join in published mode.
	// Default: DefaultSandboxNetwork-<instance>.
	SandboxNetwork string
	// Pull is the image pull policy: PullMissing (default), PullNever or
	// PullAlways.
	Pull string
	// AllowedRegistries are the registries images may be pulled from
	// (none: only images already on the engine).
	AllowedRegistries []string
	// SandboxSubnet is the sandbox network's subnet when it is made.
	// Default: one the engine picks.
	SandboxSubnet netip.Prefix
	// Nofile is each sandbox's open-file limit. Default: 4096.
	Nofile int64
	// TmpMB bounds a read-only sandbox's tmpfs /tmp, in MiB. Default: 64.
	TmpMB int64

	// Runtime, when set, is the container engine instead of Docker (unit
	// tests, benchmarks): the Docker settings above are then unused and the
	// host's size is not read.
	Runtime lifecycle.Runtime

	// Manager is the Manager's configuration, hooks included. Open fills
	// HostCPUs and HostMemoryMB from the engine when they are zero, turns
	// OrphansRemove off over a new store (see Engine.Fresh) and sets
	// Logger to Logger when nil. Its Now also stamps the store's events.
	Manager lifecycle.Config
	// Logger receives the engine's warnings. Default: none.
	Logger *zap.Logger
}

// Engine is an open engine: its store, its runtime and a Manager over them
// that is built but not started.
type Engine struct {
	// Manager is the engine's Manager. It is not started: the caller
	// completes its own wiring (the targets of the hooks) and then calls
	// Manager.Start.
	Manager *lifecycle.Manager
	// Instance is the gateway instance name: configured, or kept in the
	// store.
	Instance string

	store  *store.Store
	docker *docker.Runtime // nil with Options.Runtime
	host   docker.HostInfo
	hostOK bool
}

// Open opens (creating when needed) the store, resolves the instance name,
// builds the runtime and the Manager. On error everything opened is closed.
func Open(opts Options) (*Engine, error) {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	where := opts.Dir
	if opts.InMemory {
		where = "(in memory)"
	}
	st, err := store.Open(store.Options{Dir: opts.Dir, InMemory: opts.InMemory, Now: opts.Manager.Now})
	if err != nil {
		return nil, err
	}
	instance, err := st.Instance(opts.Instance, generateInstance)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("store %s: %w", where, err)
	}
	e := &Engine{Instance: instance, store: st}
	rt := opts.Runtime
	if rt == nil {
		e.docker, err = docker.New(docker.Options{
			Host:              opts.DockerHost,
			UpstreamMode:      opts.UpstreamMode,
			Network:           opts.Network,
			StopTimeout:       opts.StopTimeout,
			Labels:            opts.Labels,
			Instance:          instance,
			SandboxNetwork:    opts.SandboxNetwork,
			SandboxSubnet:     opts.SandboxSubnet,
			ForwardDNS:        opts.Manager.Firewall != nil,
			Pull:              opts.Pull,
			AllowedRegistries: opts.AllowedRegistries,
			Nofile:            opts.Nofile,
			TmpMB:             opts.TmpMB,
			// A record without an incarnation was made before instance
			// labels: its container and volume are this gateway's.
			Legacy: func(id string) bool {
				rec, err := st.Get(id)
				return err == nil && rec.Incarnation == ""
			},
		})
		if err != nil {
			st.Close()
			return nil, err
		}
		rt = e.docker
		e.readHost(log)
	}
	cfg := opts.Manager
	if cfg.HostCPUs == 0 {
		cfg.HostCPUs = e.host.CPUs
	}
	if cfg.HostMemoryMB == 0 {
		cfg.HostMemoryMB = e.host.MemoryMB
	}
	if e.hostOK && cfg.Isolation.Runtimes == nil {
		cfg.Isolation.Runtimes = e.host.Runtimes
	}
	if e.hostOK && cfg.Isolation.Runtime != "" && !slices.Contains(e.host.Runtimes, cfg.Isolation.Runtime) {
		e.closeParts()
		return nil, fmt.Errorf("runtime %q is not installed on the Docker engine (it has: %s); install it and register it in the engine's daemon.json, or remove the runtime option", cfg.Isolation.Runtime, strings.Join(e.host.Runtimes, ", "))
	}
	if cfg.Logger == nil {
		cfg.Logger = log
	}
	// A new store on an engine that holds containers of this instance lost
	// its records (moved, wiped, restored from nothing): nothing may be
	// removed on its word until an operator has looked.
	if st.Fresh() && cfg.OrphansRemove {
		cfg.OrphansRemove = false
		log.Warn("new store: orphans remove is off until the next start", zap.String("storage", where))
	}
	e.Manager, err = lifecycle.NewManager(st, rt, cfg)
	if err != nil {
		e.closeParts()
		return nil, err
	}
	return e, nil
}

// readHost reads the Docker host's CPUs and memory (MiB), so that specs
// asking for more are refused, and how the engine isolates containers;
// zeros when the engine cannot tell now.
func (e *Engine) readHost(log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), hostSizeTimeout)
	defer cancel()
	h, err := e.docker.HostInfo(ctx)
	if err != nil {
		log.Warn("reading the docker host's size (specs are bounded by fixed limits until restart)", zap.Error(err))
		return
	}
	e.host, e.hostOK = h, true
}

// Upstreams reports how the gateway reaches sandboxes (direct, published
// or network) and why; an automatic choice is made here if it was not yet
// (it sets up the sandbox network).
func (e *Engine) Upstreams(ctx context.Context) (mode, why string) {
	if e.docker == nil {
		return "runtime", "the engine is not Docker: its runtime says where sandboxes answer"
	}
	return e.docker.UpstreamMode(ctx)
}

// Host is what the Docker engine told of itself at Open; false when it
// could not be read (or the engine is not Docker).
func (e *Engine) Host() (docker.HostInfo, bool) { return e.host, e.hostOK }

// generateInstance draws a default instance name.
func generateInstance() string {
	b := make([]byte, 5)
	rand.Read(b)
	return "gw-" + hex.EncodeToString(b)
}

// Fresh reports whether the store was new when opened. A new store while
// the engine holds containers of this instance means the store was lost
// (see StoreWarning).
func (e *Engine) Fresh() bool { return e.store.Fresh() }

// StoreWarning is what to tell the operator after the boot reconcile: when
// the store is new but the engine holds containers of this instance
// (stats.Orphans), the store was probably lost or moved. "" otherwise.
func (e *Engine) StoreWarning(stats lifecycle.ReconcileStats) string {
	if !e.store.Fresh() || len(stats.Orphans) == 0 {
		return ""
	}
	return fmt.Sprintf("the store %s is new but Docker holds %d containers of instance %q: was the store lost or moved? Nothing is removed until the next start; restore the store, or remove the containers by hand",
		e.store.Dir(), len(stats.Orphans), e.Instance)
}

// HostSize is the engine host's CPU count and memory (MiB) as read at Open;
// zeros when it could not be read or the runtime is not Docker.
func (e *Engine) HostSize() (cpus int, memMB int64) { return e.host.CPUs, e.host.MemoryMB }

// Dir is the store's directory ("" in memory).
func (e *Engine) Dir() string { return e.store.Dir() }

// Store is the engine's store, for tools that seed or inspect it (tests,
// benchmarks); request handling goes through the Manager.
func (e *Engine) Store() lifecycle.Store { return e.store }

// Secret returns the secret kept in the store under name, creating it with
// gen on first use.
func (e *Engine) Secret(name string, gen func() ([]byte, error)) ([]byte, error) {
	return e.store.Secret(name, gen)
}

// Close closes the Manager (wakes in flight are cancelled and awaited,
// activity flushed), the runtime and the store.
//
// When the manager gave up waiting for work that ignored its cancellation
// (lifecycle.ErrCloseTimeout), the store and the runtime stay open: that
// work may still use them, and closing Badger under it could crash the
// process. At exit nothing is lost (Badger replays its log when opened);
// after a reload that moved the store elsewhere, the old one stays open
// until the process ends.
func (e *Engine) Close() error {
	if err := e.Manager.Close(); errors.Is(err, lifecycle.ErrCloseTimeout) {
		return fmt.Errorf("%w; the store is left open for the work still running", err)
	} else if err != nil {
		return errors.Join(err, e.closeParts())
	}
	return e.closeParts()
}

// closeParts closes the runtime and the store.
func (e *Engine) closeParts() error {
	var errs []error
	if e.docker != nil {
		errs = append(errs, e.docker.Close())
	}
	errs = append(errs, e.store.Close())
	return errors.Join(errs...)
}
