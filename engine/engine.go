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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	k8sclient "k8s.io/client-go/kubernetes"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
	"github.com/sandwake/sandwake/lifecycle/kubernetes"
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

// Values of Options.Kind.
const (
	KindDocker     = "docker"
	KindKubernetes = "kubernetes"
)

// Defaults of the Kubernetes engine (see lifecycle/kubernetes).
const (
	DefaultKubernetesNamespace  = kubernetes.DefaultNamespace
	DefaultKubernetesVolumeSize = kubernetes.DefaultVolumeSize
	// KubernetesEgressNetworkPolicy and KubernetesEgressUnenforced are
	// the values of KubernetesOptions.Egress.
	KubernetesEgressNetworkPolicy = kubernetes.EgressNetworkPolicy
	KubernetesEgressUnenforced    = kubernetes.EgressUnenforced
)

// informerSyncTimeout bounds Start's wait for the Kubernetes informers'
// first list.
const informerSyncTimeout = 30 * time.Second

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

	// Kind is the container engine: KindDocker (default) or
	// KindKubernetes. The Docker settings below are unused with
	// Kubernetes, Kubernetes' with Docker.
	Kind string
	// Kubernetes configures the Kubernetes engine.
	Kubernetes KubernetesOptions

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
	// Labels are added to every container and volume made (every pod,
	// claim and NetworkPolicy on Kubernetes).
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

// KubernetesOptions configure the Kubernetes engine (lifecycle/kubernetes).
// Its pods' grace period is Options.StopTimeout, their memory-backed /tmp
// Options.TmpMB; images are never pulled (imagePullPolicy Never): only
// images the nodes have are used, as with Docker and no allowed registry.
type KubernetesOptions struct {
	// Kubeconfig is the path of a kubeconfig file. Default: the pod's
	// service account in the cluster, else $KUBECONFIG, else ~/.kube/config.
	Kubeconfig string
	// Namespace holds the sandboxes' pods and claims. Default: sandwake.
	Namespace string
	// StorageClass is the workspace claims' class. Default: the cluster's
	// default class.
	StorageClass string
	// VolumeSize is each workspace claim's size (a Kubernetes quantity).
	// Default: 1Gi.
	VolumeSize string
	// NodeSelector places the sandboxes' pods on nodes with these labels.
	NodeSelector map[string]string
	// Tolerations let the sandboxes' pods onto nodes with matching taints.
	Tolerations []Toleration
	// RuntimeClass is the RuntimeClass of pods whose sandbox names no
	// runtime (gVisor, Kata). Default: the cluster's default.
	RuntimeClass string
	// Egress is how egress policies are enforced: KubernetesEgressNetworkPolicy
	// (default: a NetworkPolicy per sandbox) or KubernetesEgressUnenforced.
	Egress string
	// ClusterCIDRs are the cluster's pod and service ranges a public
	// policy does not reach (beyond the private ranges).
	ClusterCIDRs []netip.Prefix
	// GatewayCIDRs are a gateway's addresses outside the cluster, as the
	// pods see them: they may reach the sandboxes' ports.
	GatewayCIDRs []netip.Prefix
	// GatewaySelector is the labels of the gateway's pods, which may reach
	// the sandboxes' ports. Default: kubernetes.DefaultGatewaySelector.
	GatewaySelector map[string]string
}

// Toleration is one toleration of the sandboxes' pods: Key and Value
// (Operator Equal, the default with a Value), or Key alone (Exists, the
// default without one; an empty Key tolerates every taint), with Effect
// NoSchedule, PreferNoSchedule, NoExecute or "" (every effect).
type Toleration struct {
	Key      string `json:"key,omitempty"`
	Operator string `json:"operator,omitempty"`
	Value    string `json:"value,omitempty"`
	Effect   string `json:"effect,omitempty"`
}

// exists reports whether t tolerates a key whatever its value.
func (t Toleration) exists() bool {
	return t.Operator == "Exists" || (t.Operator == "" && t.Value == "")
}

// check reports a toleration Kubernetes would refuse.
func (t Toleration) check() error {
	switch {
	case t.Operator != "" && t.Operator != "Equal" && t.Operator != "Exists":
		return fmt.Errorf("toleration %q: operator %q is not Equal or Exists", t.Key, t.Operator)
	case t.Operator == "Exists" && t.Value != "":
		return fmt.Errorf("toleration %q: operator Exists takes no value", t.Key)
	case !t.exists() && t.Key == "":
		return errors.New("a toleration with a value needs a key")
	}
	if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
		return fmt.Errorf("toleration %s value %q: %s", t.Key, t.Value, strings.Join(errs, "; "))
	}
	if t.Key != "" {
		if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
			return fmt.Errorf("toleration key %q: %s", t.Key, strings.Join(errs, "; "))
		}
	}
	switch t.Effect {
	case "", "NoSchedule", "PreferNoSchedule", "NoExecute":
	default:
		return fmt.Errorf("toleration %q: effect %q is not NoSchedule, PreferNoSchedule or NoExecute", t.Key, t.Effect)
	}
	return nil
}

// tolerations are k's tolerations as the API's.
func (k KubernetesOptions) tolerations() []corev1.Toleration {
	out := make([]corev1.Toleration, 0, len(k.Tolerations))
	for _, t := range k.Tolerations {
		op := corev1.TolerationOpEqual
		if t.exists() {
			op = corev1.TolerationOpExists
		}
		out = append(out, corev1.Toleration{Key: t.Key, Operator: op, Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
	}
	return out
}

// CheckKubernetesLabels refuses configured labels the kubernetes engine
// cannot put on its pods, claims and NetworkPolicies (not Kubernetes
// labels, or sandwake's own keys).
func CheckKubernetesLabels(labels map[string]string) error {
	return kubernetes.CheckLabels(labels)
}

// Check reports a setting Kubernetes would refuse, and an instance name
// ("": none configured) that is not a Kubernetes label value (its objects
// carry it), before anything is opened.
func (k KubernetesOptions) Check(instance string) error {
	if k.Namespace != "" {
		if errs := validation.IsDNS1123Label(k.Namespace); len(errs) > 0 {
			return fmt.Errorf("namespace %q is not a Kubernetes namespace name: %s", k.Namespace, strings.Join(errs, "; "))
		}
	}
	if k.StorageClass != "" {
		if errs := validation.IsDNS1123Subdomain(k.StorageClass); len(errs) > 0 {
			return fmt.Errorf("storage_class %q is not a Kubernetes name: %s", k.StorageClass, strings.Join(errs, "; "))
		}
	}
	if k.VolumeSize != "" {
		if q, err := resource.ParseQuantity(k.VolumeSize); err != nil || q.Sign() <= 0 {
			return fmt.Errorf("volume_size %q is not a positive Kubernetes quantity such as 1Gi", k.VolumeSize)
		}
	}
	for k, v := range k.NodeSelector {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("node_selector key %q is not a Kubernetes label key: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("node_selector %s value %q is not a Kubernetes label value: %s", k, v, strings.Join(errs, "; "))
		}
	}
	for _, t := range k.Tolerations {
		if err := t.check(); err != nil {
			return err
		}
	}
	if k.RuntimeClass != "" {
		if errs := validation.IsDNS1123Subdomain(k.RuntimeClass); len(errs) > 0 {
			return fmt.Errorf("runtime_class %q is not a Kubernetes name: %s", k.RuntimeClass, strings.Join(errs, "; "))
		}
	}
	ko := kubernetes.Options{Egress: k.Egress, ClusterCIDRs: k.ClusterCIDRs, GatewayCIDRs: k.GatewayCIDRs, GatewaySelector: k.GatewaySelector}
	if err := kubernetes.CheckEgressOptions(&ko); err != nil {
		return err
	}
	if instance != "" && len(validation.IsValidLabelValue(instance)) > 0 {
		return fmt.Errorf("instance %q must also be a Kubernetes label value (ending with a letter or digit): the sandboxes' pods and claims carry it", instance)
	}
	return nil
}

// Engine is an open engine: its store, its runtime and a Manager over them
// that is built but not started.
type Engine struct {
	// Manager is the engine's Manager. It is not started: the caller
	// completes its own wiring (the targets of the hooks) and then calls
	// Start (Manager.Start alone misses a Kubernetes runtime's informers).
	Manager *lifecycle.Manager
	// Instance is the gateway instance name: configured, or kept in the
	// store.
	Instance string

	store  *store.Store
	docker *docker.Runtime     // nil with Options.Runtime or Kubernetes
	kube   *kubernetes.Runtime // nil unless Options.Kind is Kubernetes
	log    *zap.Logger
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
	e := &Engine{Instance: instance, store: st, log: log}
	rt := opts.Runtime
	switch {
	case rt != nil:
	case opts.Kind == KindKubernetes:
		e.kube, err = kubernetes.New(kubernetes.Options{
			Kubeconfig:   opts.Kubernetes.Kubeconfig,
			Namespace:    opts.Kubernetes.Namespace,
			Instance:     instance,
			StorageClass: opts.Kubernetes.StorageClass,
			VolumeSize:   opts.Kubernetes.VolumeSize,
			StopTimeout:  opts.StopTimeout,
			// No registry check stands between a create and the
			// kubelet's pull: only images the nodes have are used.
			Pull:            kubernetes.PullNever,
			TmpMB:           opts.TmpMB,
			NodeSelector:    opts.Kubernetes.NodeSelector,
			Tolerations:     opts.Kubernetes.tolerations(),
			RuntimeClass:    opts.Kubernetes.RuntimeClass,
			Egress:          opts.Kubernetes.Egress,
			ClusterCIDRs:    opts.Kubernetes.ClusterCIDRs,
			GatewayCIDRs:    opts.Kubernetes.GatewayCIDRs,
			GatewaySelector: opts.Kubernetes.GatewaySelector,
			Labels:          opts.Labels,
		})
		if err != nil {
			st.Close()
			return nil, err
		}
		rt = e.kube
	case opts.Kind != "" && opts.Kind != KindDocker:
		st.Close()
		return nil, fmt.Errorf("engine %q is not docker or kubernetes", opts.Kind)
	default:
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

// Start starts the runtime's own machinery, then the Manager: with
// Kubernetes, the pod and claim informers, waited for (within ctx and a
// bound) so that the boot reconcile reads the cluster. An API server that
// does not answer in time is not fatal, as a Docker engine down is not:
// reads fail with ErrUnavailable (wakes answer 503) until the informers
// have synced, which they keep trying.
func (e *Engine) Start(ctx context.Context) error {
	if e.kube != nil {
		ctx, cancel := context.WithTimeout(ctx, informerSyncTimeout)
		err := e.kube.StartInformers(ctx)
		cancel()
		if err != nil {
			e.log.Warn("kubernetes informers not synced at start (API server unreachable?): sandboxes answer 503 until they are", zap.Error(err))
		}
	}
	return e.Manager.Start()
}

// Kind is the container engine: KindDocker or KindKubernetes ("" for a
// runtime given in Options.Runtime).
func (e *Engine) Kind() string {
	switch {
	case e.kube != nil:
		return KindKubernetes
	case e.docker != nil:
		return KindDocker
	}
	return ""
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
	if e.kube != nil {
		return UpstreamDirect, "kubernetes: each pod is dialled at its own address on the cluster's network"
	}
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
	holder := "Docker holds %d containers"
	if e.kube != nil {
		holder = "Kubernetes holds %d sandboxes (pods or claims)"
	}
	return fmt.Sprintf("the store %s is new but "+holder+" of instance %q: was the store lost or moved? Nothing is removed until the next start; restore the store, or remove them by hand",
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
// (lifecycle.ErrCloseTimeout), the store and the Docker runtime stay open: that
// work may still use them, and closing Badger under it could crash the
// process. At exit nothing is lost (Badger replays its log when opened);
// after a reload that moved the store elsewhere, the old one stays open
// until the process ends.
func (e *Engine) Close() error {
	if err := e.Manager.Close(); errors.Is(err, lifecycle.ErrCloseTimeout) {
		// The Kubernetes runtime's informers (goroutines and watches)
		// would outlive every reload; work still running on it gets
		// ErrUnavailable from a closed runtime, which is safe.
		if e.kube != nil {
			err = errors.Join(err, e.kube.Close())
		}
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
	if e.kube != nil {
		errs = append(errs, e.kube.Close())
	}
	errs = append(errs, e.store.Close())
	return errors.Join(errs...)
}

// KubernetesClient is a client of the API server that kubeconfig names
// (empty: in the cluster, else $KUBECONFIG or ~/.kube/config), for the
// cluster's store (cluster.KubeBackend), with the server's URL for
// messages.
func KubernetesClient(kubeconfig string) (k8sclient.Interface, string, error) {
	cs, host, err := kubernetes.NewClient(kubeconfig)
	if err != nil {
		return nil, "", fmt.Errorf("finding the Kubernetes API server: %w", err)
	}
	return cs, host, nil
}
