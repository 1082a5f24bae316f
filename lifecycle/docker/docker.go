package docker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
)

// Labels every container, volume and network sandwake makes carries.
const (
	LabelManaged = "sandwake.managed"
	LabelID      = "sandwake.id"
	// LabelInstance names the gateway instance that owns the object: a
	// runtime acts only on objects of its own instance.
	LabelInstance = "sandwake.instance"
	// LabelPool and LabelPoolKey mark a container made for a template's
	// warm pool: the template and the shape it was made in.
	LabelPool    = "sandwake.pool"
	LabelPoolKey = "sandwake.pool.key"
	// LabelOwnerIncarnation and LabelOwnerPrefix+<key> record on a
	// workspace volume the incarnation and labels of the record whose
	// create made it: whose the volume's files are (lifecycle.VolumeOwner).
	LabelOwnerIncarnation = "sandwake.owner.incarnation"
	LabelOwnerPrefix      = "sandwake.owner.label."
)

// Image pull policies.
const (
	// PullMissing pulls an image the engine does not have.
	PullMissing = "missing"
	// PullNever refuses an image the engine does not have.
	PullNever = "never"
	// PullAlways pulls the image at every create, so that a moving tag
	// (latest) is the registry's current one.
	PullAlways = "always"
)

// DefaultSandboxNetwork is the prefix of the network sandboxes join in
// published mode: sandwake-<instance>.
const DefaultSandboxNetwork = "sandwake"

// DefaultStopTimeout is how long a stop waits for the app to exit before
// the engine kills it.
const DefaultStopTimeout = 10 * time.Second

// Upstream modes.
const (
	// UpstreamPublished publishes each declared port on 127.0.0.1 with an
	// ephemeral host port: for a gateway running on the Docker host.
	UpstreamPublished = "published"
	// UpstreamNetwork attaches containers to a named network and dials
	// s-<id>:<port>: for a gateway running in a container on that network.
	UpstreamNetwork = "network"
)

// Options configure the runtime.
type Options struct {
	// Host is the engine address (unix:///var/run/docker.sock, tcp://…).
	// Default: DOCKER_HOST, else the local socket.
	Host string
	// UpstreamMode is UpstreamAuto (default: direct where the engine is
	// local and the sandbox bridge in this namespace, else published),
	// UpstreamDirect, UpstreamPublished or UpstreamNetwork.
	UpstreamMode string
	// Network is the Docker network of UpstreamNetwork mode.
	Network string
	// StopTimeout is how long a stop waits for the app to exit before the
	// engine kills it. Default: 10s.
	StopTimeout time.Duration
	// Labels are added to every container and volume and narrow List to
	// them, so that several gateways (or test runs) share one engine.
	Labels map[string]string
	// Instance is the name of the gateway instance: every object the
	// runtime makes carries it (LabelInstance), and the runtime acts only
	// on objects that carry it. Required.
	Instance string
	// Legacy reports whether sandbox id's record predates instance labels;
	// its container and volume, labelled sandwake.managed without an
	// instance, are then adopted as this instance's. Nil: none are.
	Legacy func(id string) bool
	// SandboxNetwork is the bridge network sandboxes join in published
	// mode, created when missing with inter-container communication off so
	// that sandboxes cannot reach each other, a subnet of its own and the
	// engine's allocation kept to the top sixteenth of it, so that
	// sandwake fixes each sandbox's address. It is the instance's own: one
	// labelled with another instance is refused. Default:
	// sandwake-<instance>.
	SandboxNetwork string
	// SandboxSubnet is the sandbox network's subnet when sandwake creates
	// it. Default: one the engine picks from its address pools.
	SandboxSubnet netip.Prefix
	// ForwardDNS makes every container given an address on the sandbox
	// network resolve through the egress firewall's forwarder on the
	// network's gateway (Docker's embedded resolver asks it from the
	// container's own address). Set where the firewall is enforced.
	ForwardDNS bool
	// Pull is the image pull policy: PullMissing (default), PullNever or
	// PullAlways.
	Pull string
	// AllowedRegistries are the registries (host[:port] as in the image
	// reference; "docker.io" for Docker Hub) images may be pulled from.
	// Empty: none, so only images already on the engine are used.
	AllowedRegistries []string
	// Nofile is each sandbox's open-file limit (soft and hard). Default:
	// DefaultNofile.
	Nofile int64
	// TmpMB bounds the tmpfs /tmp of a sandbox with a read-only root
	// filesystem, in MiB. Default: DefaultTmpMB.
	TmpMB int64
}

// DefaultNofile is a sandbox's open-file limit when Options.Nofile is 0.
const DefaultNofile = 4096

// DefaultTmpMB is the size of a read-only sandbox's /tmp when Options.TmpMB
// is 0.
const DefaultTmpMB = 64

// Runtime is a lifecycle.Runtime on a Docker Engine.
type Runtime struct {
	cli  *client.Client
	opts Options

	// owned maps sandbox ids to the engine ids of containers checked to be
	// this instance's: operations address containers by those ids, so an
	// object that merely took the name later is never acted on.
	owned sync.Map
	// groups maps sandbox ids to whether their container is a group's
	// app (group.go), as created or first inspected.
	groups sync.Map
	// disk maps sandbox ids to their diskDirs (see DiskUsage).
	disk sync.Map
	// noQuota: the storage driver refused a size quota; creates no longer
	// ask for one.
	noQuota atomic.Bool
	// ooms are the engine's late OOM reports (oom.go).
	ooms oomReports

	netMu sync.Mutex
	// mode is the upstream mode in force (see upstream.go); nil until an
	// automatic choice is made.
	mode atomic.Pointer[upstreamChoice]
}

// New connects a runtime to the engine (no request is made until used).
func New(opts Options) (*Runtime, error) {
	if opts.UpstreamMode == "" {
		opts.UpstreamMode = UpstreamAuto
	}
	switch opts.UpstreamMode {
	case UpstreamAuto, UpstreamDirect, UpstreamPublished:
	case UpstreamNetwork:
		if opts.Network == "" {
			return nil, errors.New("docker runtime: upstream mode network needs a network name")
		}
	default:
		return nil, fmt.Errorf("docker runtime: unknown upstream mode %q (auto, direct, published or network)", opts.UpstreamMode)
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	if opts.Instance == "" {
		return nil, errors.New("docker runtime: an instance name is required")
	}
	if opts.SandboxNetwork == "" {
		opts.SandboxNetwork = DefaultSandboxNetwork + "-" + opts.Instance
	}
	if opts.Nofile <= 0 {
		opts.Nofile = DefaultNofile
	}
	if opts.TmpMB <= 0 {
		opts.TmpMB = DefaultTmpMB
	}
	switch opts.Pull {
	case "":
		opts.Pull = PullMissing
	case PullMissing, PullNever, PullAlways:
	default:
		return nil, fmt.Errorf("docker runtime: unknown pull policy %q (missing, never or always)", opts.Pull)
	}
	clientOpts := []client.Opt{client.FromEnv}
	if opts.Host != "" {
		clientOpts = append(clientOpts, client.WithHost(opts.Host))
	}
	cli, err := client.New(clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("docker runtime: %w", err)
	}
	r := &Runtime{cli: cli, opts: opts}
	switch opts.UpstreamMode {
	case UpstreamDirect, UpstreamPublished:
		r.mode.Store(&upstreamChoice{mode: opts.UpstreamMode, why: "set by the operator (upstream_mode " + opts.UpstreamMode + ")"})
	case UpstreamNetwork:
		r.mode.Store(&upstreamChoice{mode: opts.UpstreamMode, why: "set by the operator (upstream_mode network " + opts.Network + "): sandboxes are dialled by name on that network"})
	}
	return r, nil
}

// Close releases the client's connections.
func (r *Runtime) Close() error { return r.cli.Close() }

// ContainerName is the name of sandbox id's container.
func ContainerName(id string) string { return "s-" + id }

// VolumeName is the name of sandbox id's workspace volume.
func VolumeName(id string) string { return "s-" + id + "-data" }

func (r *Runtime) labels(id string) map[string]string {
	l := maps.Clone(r.opts.Labels)
	if l == nil {
		l = make(map[string]string, 3)
	}
	l[LabelManaged] = "true"
	l[LabelInstance] = r.opts.Instance
	if id != "" {
		l[LabelID] = id
	}
	return l
}

// owns reports whether an object of sandbox id with these labels is this
// instance's: labelled with its instance, or (made before instance labels
// existed) labelled as sandwake's for a record that predates them.
func (r *Runtime) owns(id string, labels map[string]string) bool {
	if labels[LabelManaged] != "true" || labels[LabelID] != id {
		return false
	}
	switch inst := labels[LabelInstance]; {
	case inst == r.opts.Instance:
		return true
	case inst == "" && r.opts.Legacy != nil:
		return r.opts.Legacy(id)
	default:
		return false
	}
}

// notOurs is the error for a name held by an object this instance does not
// own: for operations on an existing sandbox the container is as good as
// gone (ErrContainerNotFound); a create gets ErrIDTaken.
func notOurs(kind, name string, labels map[string]string, sentinel error) error {
	owner := "no sandwake labels"
	if labels[LabelManaged] == "true" {
		owner = "sandwake instance " + strconv.Quote(labels[LabelInstance])
		if labels[LabelInstance] == "" {
			owner = "a sandwake gateway without instance labels"
		}
	}
	return fmt.Errorf("%w: %s %s exists and is not this gateway's (it has %s); nothing of it was touched", sentinel, kind, name, owner)
}

// resolve returns the engine id of sandbox id's container after checking
// that it is this instance's (once; the answer is kept).
func (r *Runtime) resolve(ctx context.Context, id string) (string, error) {
	if v, ok := r.owned.Load(id); ok {
		return v.(string), nil
	}
	res, err := r.cli.ContainerInspect(ctx, ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		return "", classify("inspecting container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
	}
	if !r.ownsContainer(id, &res.Container) {
		return "", notOurs("container", ContainerName(id), containerLabels(&res.Container), lifecycle.ErrContainerNotFound)
	}
	r.owned.Store(id, res.Container.ID)
	return res.Container.ID, nil
}

func containerLabels(ci *container.InspectResponse) map[string]string {
	if ci.Config == nil {
		return nil
	}
	return ci.Config.Labels
}

func (r *Runtime) ownsContainer(id string, ci *container.InspectResponse) bool {
	return r.owns(id, containerLabels(ci))
}

// do runs op on sandbox id's container, addressed by its engine id; a
// container gone meanwhile is forgotten so that the next call looks again.
func (r *Runtime) do(ctx context.Context, id, doing string, op func(cid string) error) error {
	cid, err := r.resolve(ctx, id)
	if err != nil {
		return fmt.Errorf("%s %s: %w", doing, ContainerName(id), err)
	}
	err = op(cid)
	if err != nil && cerrdefs.IsNotFound(err) {
		r.owned.Delete(id)
	}
	return classify(doing+" "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
}

// CheckImage implements lifecycle.ImageChecker: the image is on the engine,
// or the pull policy allows pulling it and the pull succeeds.
func (r *Runtime) CheckImage(ctx context.Context, image string) error {
	return r.ensureImage(ctx, image)
}

// Create implements lifecycle.Runtime. A container or volume under the
// sandbox's names that is not this instance's is never removed or reused:
// the create fails with ErrIDTaken. A volume the create made is removed
// again when the create fails.
func (r *Runtime) Create(ctx context.Context, id string, spec lifecycle.Spec) (c lifecycle.Container, err error) {
	if err := r.ensureImage(ctx, spec.Image); err != nil {
		return lifecycle.Container{}, err
	}
	sn, err := r.ensureNetwork(ctx)
	if err != nil {
		return lifecycle.Container{}, err
	}
	// The old container of this sandbox (a recreate) goes; anyone else's
	// under the name stops the create.
	if old, err := r.cli.ContainerInspect(ctx, ContainerName(id), client.ContainerInspectOptions{}); err == nil {
		if !r.ownsContainer(id, &old.Container) {
			return lifecycle.Container{}, notOurs("container", ContainerName(id), containerLabels(&old.Container), lifecycle.ErrIDTaken)
		}
		if _, err := r.cli.ContainerRemove(ctx, old.Container.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return lifecycle.Container{}, classify("removing container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
		}
		r.owned.Delete(id)
	} else if !cerrdefs.IsNotFound(err) {
		return lifecycle.Container{}, classify("inspecting container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
	}
	// The members of an earlier group of this id go (a recreate, maybe
	// without services now), before anything of this create is made.
	if err := r.removeMembers(ctx, id); err != nil {
		return lifecycle.Container{}, err
	}
	labels := r.labels(id)
	// From the volume on, what this create makes is made whatever the
	// caller does meanwhile (see the container create below): a caller
	// giving up between the engine's making of the volume and its answer
	// would otherwise leave the volume unrecorded and the create half done.
	vctx, vcancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	defer vcancel()
	madeVolume, err := r.ensureVolume(vctx, id, VolumeName(id), labels, spec, false)
	if err != nil {
		return lifecycle.Container{}, err
	}
	defer func() {
		if err != nil && madeVolume {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			r.cli.VolumeRemove(rctx, VolumeName(id), client.VolumeRemoveOptions{})
		}
	}()

	env := make([]string, 0, len(spec.Env))
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, k+"="+spec.Env[k])
	}
	exposed := network.PortSet{}
	bindings := network.PortMap{}
	loopback := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	for _, p := range spec.Ports {
		port, _ := network.PortFrom(uint16(p), network.TCP)
		exposed[port] = struct{}{}
		if r.published() {
			bindings[port] = []network.PortBinding{{HostIP: loopback}}
		}
	}
	cfg := &container.Config{
		Image:        spec.Image,
		Cmd:          spec.Cmd,
		Env:          env,
		ExposedPorts: exposed,
		Labels:       containerLabelsFor(labels, spec.Pool),
		Hostname:     ContainerName(id),
		User:         spec.User,
	}
	hc := &container.HostConfig{
		PortBindings: bindings,
		Mounts: []mount.Mount{{
			Type:   mount.TypeVolume,
			Source: VolumeName(id),
			Target: spec.WorkspacePath,
		}},
		// The engine's default seccomp profile (and AppArmor profile,
		// where the host has AppArmor) applies to every container not
		// given another: none is ever turned off here. HostInfo reports
		// what the engine has.
		SecurityOpt: []string{"no-new-privileges"},
		// Every capability goes, then the documented minimum comes back
		// (lifecycle.SandboxCapabilities), and what the spec asked of the
		// rest of Docker's default set.
		CapDrop:        []string{"ALL"},
		CapAdd:         append(slices.Clone(lifecycle.SandboxCapabilities), spec.CapAdd...),
		ReadonlyRootfs: spec.ReadonlyRootfs != nil && *spec.ReadonlyRootfs,
		Runtime:        spec.Runtime,
		// Bounded logs: thousands of sandboxes must not fill the disk.
		LogConfig: container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "10m", "max-file": "2"}},
	}
	if spec.MemoryMB > 0 {
		hc.Memory = spec.MemoryMB << 20
		hc.MemorySwap = hc.Memory // no swap: a sandbox over its limit is OOM-killed, visibly
	}
	if spec.CPUs > 0 {
		hc.NanoCPUs = int64(spec.CPUs * 1e9)
	}
	if spec.PidsLimit > 0 {
		pids := spec.PidsLimit
		hc.PidsLimit = &pids
	}
	hc.Ulimits = []*container.Ulimit{{Name: "nofile", Soft: r.opts.Nofile, Hard: r.opts.Nofile}}
	if hc.ReadonlyRootfs {
		hc.Tmpfs = map[string]string{"/tmp": fmt.Sprintf("rw,nosuid,nodev,size=%dm,mode=1777", r.opts.TmpMB)}
	}
	if r.opts.UpstreamMode == UpstreamNetwork {
		hc.NetworkMode = container.NetworkMode(r.opts.Network)
	} else {
		hc.NetworkMode = container.NetworkMode(r.opts.SandboxNetwork)
	}
	opts := client.ContainerCreateOptions{Name: ContainerName(id), Config: cfg, HostConfig: hc}
	forwarded := r.opts.ForwardDNS && spec.Address.IsValid() && r.ownsNetwork() && sn.Gateway.IsValid()
	if forwarded {
		// Docker's embedded resolver (127.0.0.11 in the container) asks
		// this server, from the container's network namespace.
		hc.DNS = []netip.Addr{sn.Gateway}
	}
	if spec.Address.IsValid() && r.ownsNetwork() {
		// The address the Manager chose, whose firewall entry already
		// exists: the container's first packet meets its policy.
		opts.NetworkingConfig = &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
			r.opts.SandboxNetwork: {IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: spec.Address}},
		}}
	}
	group := len(spec.Services) > 0
	if group {
		// The infra container takes what Docker keeps on a namespace's
		// owner; the app joins its namespace. Made whatever the caller
		// does meanwhile, as the app's container is (below).
		gctx, gcancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
		defer gcancel()
		infraID, volumes, gerr := r.createGroup(gctx, id, spec, cfg.Labels, cfg.ExposedPorts, hc.PortBindings, hc.DNS)
		if gerr != nil {
			return lifecycle.Container{}, gerr
		}
		defer func() {
			if err != nil {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				r.removeMembers(rctx, id)
				r.removeVolumes(rctx, volumes)
			}
		}()
		cfg.Labels = maps.Clone(cfg.Labels)
		cfg.Labels[LabelGroup] = "true"
		cfg.Labels[LabelGroupServices] = strings.Join(slices.Sorted(maps.Keys(spec.Services)), ",")
		cfg.ExposedPorts, cfg.Hostname = nil, ""
		hc.PortBindings, hc.DNS = nil, nil
		hc.NetworkMode = container.NetworkMode("container:" + infraID)
		opts.NetworkingConfig = nil
	}
	r.groups.Store(id, group)
	quota := spec.DiskMB > 0 && !r.noQuota.Load()
	if quota {
		// A hard quota on the writable layer where the storage driver has
		// one (overlay2 on xfs with pquota, btrfs, zfs); the watchdog
		// covers the workspace, and everything where it has none.
		hc.StorageOpt = map[string]string{"size": fmt.Sprintf("%dm", spec.DiskMB)}
	}
	// The engine goes on making a container whose request the client gave
	// up on: a cancelled create would remove the volume above while the
	// container still comes, and Docker would then make the volume again,
	// unlabelled, for it. The call is left to finish (it is quick).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	defer cancel()
	res, err := r.cli.ContainerCreate(cctx, opts)
	if err != nil && quota && (cerrdefs.IsInvalidArgument(err) || strings.Contains(strings.ToLower(err.Error()), "storage-opt")) {
		hc.StorageOpt = nil
		if res2, err2 := r.cli.ContainerCreate(cctx, opts); err2 == nil {
			// The driver has no quota (fuse-overlayfs, overlay2 on ext4):
			// the watchdog alone bounds the disk from now on.
			r.noQuota.Store(true)
			res, err = res2, nil
		}
	}
	if err != nil {
		switch {
		case cerrdefs.IsConflict(err):
			// Another gateway took the name since the inspect above.
			return lifecycle.Container{}, fmt.Errorf("%w: container %s was created by someone else meanwhile: %w", lifecycle.ErrIDTaken, ContainerName(id), lifecycle.EngineFailure(err))
		case cerrdefs.IsInvalidArgument(err):
			return lifecycle.Container{}, fmt.Errorf("%w: docker refused the sandbox's spec: %w", lifecycle.ErrInvalid, lifecycle.EngineFailure(err))
		}
		return lifecycle.Container{}, classify("creating container "+ContainerName(id), err, lifecycle.ErrImageNotFound)
	}
	r.owned.Store(id, res.ID)
	return lifecycle.Container{ID: res.ID, SandboxID: id, State: lifecycle.ContainerCreated, DNSForwarded: forwarded}, nil
}

// ForwardsDNS implements lifecycle.DNSForwarding.
func (r *Runtime) ForwardsDNS() bool { return r.opts.ForwardDNS && r.ownsNetwork() }

// volumeLabels are the labels of a workspace volume a create makes: the
// sandbox's, and the owner its record is (none for a pool container's,
// whose claim is recorded by the Manager).
func volumeLabels(labels map[string]string, spec lifecycle.Spec) map[string]string {
	if spec.Incarnation == "" {
		return labels
	}
	l := maps.Clone(labels)
	l[LabelOwnerIncarnation] = spec.Incarnation
	for k, v := range spec.Labels {
		l[LabelOwnerPrefix+k] = v
	}
	return l
}

// VolumeOwner implements lifecycle.VolumeInspector. A volume under the
// name that is not this instance's is reported missing: the create then
// refuses the id as taken (ErrIDTaken) without touching it.
func (r *Runtime) VolumeOwner(ctx context.Context, id string) (o lifecycle.VolumeOwner, recorded, exists bool, err error) {
	vol, err := r.cli.VolumeInspect(ctx, VolumeName(id), client.VolumeInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return o, false, false, nil
	}
	if err != nil {
		return o, false, false, classify("inspecting volume "+VolumeName(id), err, lifecycle.ErrNotFound)
	}
	if !r.owns(id, vol.Volume.Labels) {
		return o, false, false, nil
	}
	o.Incarnation, recorded = vol.Volume.Labels[LabelOwnerIncarnation]
	for k, v := range vol.Volume.Labels {
		if key, ok := strings.CutPrefix(k, LabelOwnerPrefix); ok {
			if o.Labels == nil {
				o.Labels = map[string]string{}
			}
			o.Labels[key] = v
		}
	}
	return o, recorded, true, nil
}

// createTimeout bounds a container create, which runs to its end even when
// its caller gives up (see Create).
const createTimeout = 30 * time.Second

// containerLabelsFor adds a pool container's labels to a sandbox's.
func containerLabelsFor(labels map[string]string, pool lifecycle.PoolTag) map[string]string {
	if pool.Template == "" {
		return labels
	}
	l := maps.Clone(labels)
	l[LabelPool] = pool.Template
	l[LabelPoolKey] = pool.Key
	return l
}

// ImageID implements lifecycle.ImageResolver: the id of the image ref
// names on the engine.
func (r *Runtime) ImageID(ctx context.Context, ref string) (string, error) {
	res, err := r.cli.ImageInspect(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("%w: image %q is not on the engine", lifecycle.ErrImageNotFound, ref)
	}
	if err != nil {
		return "", classify("inspecting image "+ref, err, lifecycle.ErrImageNotFound)
	}
	return res.ID, nil
}

// ensureImage pulls image when the engine does not have it (or, with
// PullAlways, at every create), from an allowed registry only.
func (r *Runtime) ensureImage(ctx context.Context, image string) error {
	if r.opts.Pull != PullAlways {
		_, err := r.cli.ImageInspect(ctx, image)
		if err == nil {
			return nil
		}
		if !cerrdefs.IsNotFound(err) {
			return classify("inspecting image "+image, err, lifecycle.ErrImageNotFound)
		}
		if r.opts.Pull == PullNever {
			return fmt.Errorf("%w: image %q is not on the engine and the pull policy is never", lifecycle.ErrImageNotFound, image)
		}
	}
	if registry, ok := r.registryAllowed(image); !ok {
		allowed := "none: only images already on the engine are used"
		if len(r.opts.AllowedRegistries) > 0 {
			allowed = strings.Join(r.opts.AllowedRegistries, " ")
		}
		what := "is not on the engine and"
		if r.opts.Pull == PullAlways {
			what = "must be pulled (pull always), but"
		}
		return fmt.Errorf("%w: image %q %s its registry %s is not one sandwake may pull from (allowed_registries: %s)", lifecycle.ErrImageNotFound, image, what, registry, allowed)
	}
	pull, err := r.cli.ImagePull(ctx, image, client.ImagePullOptions{})
	if err == nil {
		err = pull.Wait(ctx)
	}
	if err != nil {
		if isTransient(err) {
			return classify("pulling image "+image, err, lifecycle.ErrImageNotFound)
		}
		return fmt.Errorf("%w: image %q is not on the engine and pulling it failed: %w", lifecycle.ErrImageNotFound, image, lifecycle.EngineFailure(err))
	}
	return nil
}

// registryAllowed answers image's registry and whether AllowedRegistries
// names it (case-insensitive).
func (r *Runtime) registryAllowed(image string) (string, bool) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "(not a reference)", false
	}
	registry := reference.Domain(named)
	for _, a := range r.opts.AllowedRegistries {
		if strings.EqualFold(a, registry) {
			return registry, true
		}
	}
	return registry, false
}

// Start implements lifecycle.Runtime.
func (r *Runtime) Start(ctx context.Context, id string) (lifecycle.Container, error) {
	// (An engine that cannot say is reported by the start below.)
	if g, err := r.isGroup(ctx, id); err == nil && g {
		// The network's owner and every service, ready, before the app.
		if err := r.startGroup(ctx, id); err != nil {
			return lifecycle.Container{}, err
		}
	}
	err := r.do(ctx, id, "starting container", func(cid string) error {
		_, err := r.cli.ContainerStart(ctx, cid, client.ContainerStartOptions{})
		return err
	})
	if err != nil {
		return lifecycle.Container{}, err
	}
	return r.Inspect(ctx, id)
}

// Pause implements lifecycle.Runtime.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	err := r.do(ctx, id, "pausing container", func(cid string) error {
		_, err := r.cli.ContainerPause(ctx, cid, client.ContainerPauseOptions{})
		return err
	})
	if g, gerr := r.isGroup(ctx, id); err == nil && gerr == nil && g {
		// The services after the app (the network's owner runs nothing).
		err = r.groupDo(ctx, id, true, true, "pausing container", func(cid string) error {
			_, err := r.cli.ContainerPause(ctx, cid, client.ContainerPauseOptions{})
			if err != nil && strings.Contains(err.Error(), "already paused") {
				return nil
			}
			return err
		})
	}
	return err
}

// Unpause implements lifecycle.Runtime.
func (r *Runtime) Unpause(ctx context.Context, id string) error {
	if g, err := r.isGroup(ctx, id); err == nil && g {
		// The services before the app, which may call them at once.
		if err := r.groupDo(ctx, id, false, true, "unpausing container", func(cid string) error {
			_, err := r.cli.ContainerUnpause(ctx, cid, client.ContainerUnpauseOptions{})
			if err != nil && strings.Contains(err.Error(), "is not paused") {
				return nil
			}
			return err
		}); err != nil {
			return err
		}
	}
	return r.do(ctx, id, "unpausing container", func(cid string) error {
		_, err := r.cli.ContainerUnpause(ctx, cid, client.ContainerUnpauseOptions{})
		return err
	})
}

// Stop implements lifecycle.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	secs := int(r.opts.StopTimeout / time.Second)
	err := r.do(ctx, id, "stopping container", func(cid string) error {
		_, err := r.cli.ContainerStop(ctx, cid, client.ContainerStopOptions{Timeout: &secs})
		return err
	})
	if g, gerr := r.isGroup(ctx, id); gerr == nil && g {
		// The services in reverse order, the network's owner last.
		if gerr := r.groupDo(ctx, id, true, false, "stopping container", func(cid string) error {
			_, err := r.cli.ContainerStop(ctx, cid, client.ContainerStopOptions{Timeout: &secs})
			return err
		}); err == nil {
			err = gerr
		}
	}
	return err
}

// Remove implements lifecycle.Runtime. A container that is missing, or that
// is not this instance's, is left alone and is not an error.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	err := r.do(ctx, id, "removing container", func(cid string) error {
		_, err := r.cli.ContainerRemove(ctx, cid, client.ContainerRemoveOptions{Force: true})
		return err
	})
	if errors.Is(err, lifecycle.ErrContainerNotFound) {
		err = nil
	}
	if err == nil {
		r.owned.Delete(id)
		r.groups.Delete(id)
		err = r.removeMembers(ctx, id)
	}
	return err
}

// RemoveVolume implements lifecycle.Runtime: the volumes of the sandbox's
// services, then its app's. The size comes from the engine's disk-usage
// report, read just before removal. A volume that is not this instance's
// wraps ErrNotFound and is left alone. The app's volume goes last: it is
// what a create asks whose the id's past is (lifecycle.VolumeOwner), so a
// purge cut short leaves it, and the id stays its owner's until a purge
// ends.
func (r *Runtime) RemoveVolume(ctx context.Context, id string) (int64, error) {
	name := VolumeName(id)
	vol, err := r.cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
	// With the app's volume gone (a purge cut short after it, a create that
	// failed past its services' volumes in an earlier release) the
	// services' volumes still go, or nothing could ever remove them.
	appGone := cerrdefs.IsNotFound(err)
	if err != nil && !appGone {
		return 0, classify("inspecting volume "+name, err, lifecycle.ErrNotFound)
	}
	if !appGone && !r.owns(id, vol.Volume.Labels) {
		return 0, notOurs("volume", name, vol.Volume.Labels, lifecycle.ErrNotFound)
	}
	members, lerr := r.memberVolumes(ctx, id)
	if lerr != nil {
		return 0, lerr
	}
	if appGone && len(members) == 0 {
		return 0, classify("inspecting volume "+name, err, lifecycle.ErrNotFound)
	}
	sizes, err := r.volumeSizes(ctx)
	if err != nil {
		return 0, err
	}
	// The services' volumes first: the app's, which a create asks first
	// for its owner, goes last.
	var freed int64
	for _, v := range members {
		if _, err := r.cli.VolumeRemove(ctx, v, client.VolumeRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return freed, classify("removing volume "+v, err, lifecycle.ErrNotFound)
		}
		freed += sizes[v]
	}
	if appGone {
		return freed, nil
	}
	if _, err := r.cli.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true}); err != nil {
		return freed, classify("removing volume "+name, err, lifecycle.ErrNotFound)
	}
	return freed + sizes[name], nil
}

// memberVolumes names this instance's volumes of sandbox id's services.
func (r *Runtime) memberVolumes(ctx context.Context, id string) ([]string, error) {
	f := client.Filters{}.Add("label", LabelID+"="+id).Add("name", "s-"+id+"--")
	res, err := r.cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return nil, classify("listing volumes of "+ContainerName(id), err, lifecycle.ErrNotFound)
	}
	var out []string
	for _, v := range res.Items {
		if strings.HasPrefix(v.Name, "s-"+id+"--") && r.owns(id, v.Labels) {
			out = append(out, v.Name)
		}
	}
	return out, nil
}

// volumeSizes reads the bytes each volume holds from the engine's
// disk-usage report, once for a whole purge. The engine runs one such
// report at a time and refuses another meanwhile ("a disk usage operation
// is already running": another purge, `docker system df`), so a refusal is
// retried for a few seconds.
func (r *Runtime) volumeSizes(ctx context.Context) (map[string]int64, error) {
	for attempt := 0; ; attempt++ {
		du, err := r.cli.DiskUsage(ctx, client.DiskUsageOptions{Volumes: true, Verbose: true})
		if err == nil {
			sizes := make(map[string]int64, len(du.Volumes.Items))
			for _, v := range du.Volumes.Items {
				if v.UsageData != nil && v.UsageData.Size > 0 {
					sizes[v.Name] = v.UsageData.Size
				}
			}
			return sizes, nil
		}
		if !strings.Contains(err.Error(), "already running") || attempt == 30 {
			return nil, classify("reading volume sizes", err, lifecycle.ErrNotFound)
		}
		select {
		case <-ctx.Done():
			return nil, classify("reading volume sizes", ctx.Err(), lifecycle.ErrNotFound)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Inspect implements lifecycle.Runtime.
func (r *Runtime) Inspect(ctx context.Context, id string) (lifecycle.Container, error) {
	res, err := r.cli.ContainerInspect(ctx, ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			r.owned.Delete(id)
		}
		return lifecycle.Container{}, classify("inspecting container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
	}
	if !r.ownsContainer(id, &res.Container) {
		r.owned.Delete(id)
		return lifecycle.Container{}, notOurs("container", ContainerName(id), containerLabels(&res.Container), lifecycle.ErrContainerNotFound)
	}
	r.owned.Store(id, res.Container.ID)
	c := r.fromInspect(id, &res.Container)
	group := containerLabels(&res.Container)[LabelGroup] == "true"
	r.groups.Store(id, group)
	if group {
		if err := r.memberStates(ctx, id, containerLabels(&res.Container), &c); err != nil {
			return lifecycle.Container{}, err
		}
	}
	r.ooms.explain(id, &c, time.Now())
	return c, nil
}

func (r *Runtime) fromInspect(id string, ci *container.InspectResponse) lifecycle.Container {
	c := lifecycle.Container{ID: ci.ID, SandboxID: id}
	if s := ci.State; s != nil {
		c.State = lifecycle.ContainerState(s.Status)
		c.ExitCode = s.ExitCode
		c.OOMKilled = s.OOMKilled
		c.Pid = s.Pid
		c.StartedAt, _ = time.Parse(time.RFC3339Nano, s.StartedAt)
		c.FinishedAt, _ = time.Parse(time.RFC3339Nano, s.FinishedAt)
	}
	if ci.Config != nil {
		c.Upstreams = r.upstreams(id, ci)
	}
	if hc := ci.HostConfig; hc != nil {
		for _, bs := range hc.PortBindings {
			c.Published = c.Published || len(bs) > 0
		}
		c.DNSForwarded = r.opts.ForwardDNS && len(hc.DNS) > 0
	}
	if ns := ci.NetworkSettings; ns != nil {
		if ep := ns.Networks[r.opts.SandboxNetwork]; ep != nil && len(ep.MacAddress) > 0 {
			c.MAC = ep.MacAddress.String()
		}
	}
	return c
}

// upstreams reads the address of each exposed port: the container's own
// address on the sandbox network (direct), the published host port on
// loopback, or the container's name on the network. In direct mode a
// container not on the sandbox network (made before it existed) keeps its
// published ports.
func (r *Runtime) upstreams(id string, ci *container.InspectResponse) map[int]string {
	ups := make(map[int]string, len(ci.Config.ExposedPorts))
	var own netip.Addr
	if r.direct() && ci.NetworkSettings != nil {
		if ep := ci.NetworkSettings.Networks[r.opts.SandboxNetwork]; ep != nil && ep.IPAddress.IsValid() {
			own = ep.IPAddress.Unmap()
		}
	}
	for port := range ci.Config.ExposedPorts {
		p := int(port.Num())
		if r.opts.UpstreamMode == UpstreamNetwork {
			ups[p] = ContainerName(id) + ":" + strconv.Itoa(p)
			continue
		}
		if own.IsValid() {
			ups[p] = netip.AddrPortFrom(own, uint16(p)).String()
			continue
		}
		if ci.NetworkSettings == nil {
			continue
		}
		for _, b := range ci.NetworkSettings.Ports[port] {
			if b.HostPort == "" {
				continue
			}
			host := "127.0.0.1"
			if b.HostIP.IsValid() && !b.HostIP.IsUnspecified() {
				host = b.HostIP.String()
			}
			ups[p] = netip.AddrPortFrom(netip.MustParseAddr(host), mustPort(b.HostPort)).String()
			break
		}
	}
	return ups
}

func mustPort(s string) uint16 {
	n, _ := strconv.ParseUint(s, 10, 16)
	return uint16(n)
}

// List implements lifecycle.Runtime: this instance's containers only, so
// other gateways' containers are neither orphans nor reconciled.
func (r *Runtime) List(ctx context.Context) ([]lifecycle.Container, error) {
	f := client.Filters{}.Add("label", LabelManaged+"=true")
	for k, v := range r.opts.Labels {
		f.Add("label", k+"="+v)
	}
	res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, classify("listing containers", err, lifecycle.ErrContainerNotFound)
	}
	out := make([]lifecycle.Container, 0, len(res.Items))
	// A group's app running beside a member that is not, or without one
	// it was made with, is listed exited, as Inspect reports it, so that
	// reconcile looks closer.
	broken := map[string]bool{}
	present := map[string][]member{}
	for _, s := range res.Items {
		if s.Labels[LabelMember] == "" || !r.owns(s.Labels[LabelID], s.Labels) {
			continue
		}
		present[s.Labels[LabelID]] = append(present[s.Labels[LabelID]], member{name: s.Labels[LabelMember]})
		if s.State != container.StateRunning {
			broken[s.Labels[LabelID]] = true
		}
	}
	for _, s := range res.Items {
		if !r.owns(s.Labels[LabelID], s.Labels) || s.Labels[LabelMember] != "" {
			continue
		}
		id := s.Labels[LabelID]
		if s.State == container.StateRunning && s.Labels[LabelGroup] == "true" && (broken[id] || missingService(s.Labels, present[id]) != "") {
			s.State = container.StateExited
		}
		out = append(out, lifecycle.Container{
			ID:        s.ID,
			SandboxID: s.Labels[LabelID],
			State:     lifecycle.ContainerState(s.State),
			Pool:      s.Labels[LabelPool],
			PoolKey:   s.Labels[LabelPoolKey],
		})
	}
	return out, nil
}

// Events implements lifecycle.EventSource: the engine's container events
// (die, oom, destroy, pause, unpause, start, health_status) for this
// runtime's containers. health_status actions carry a suffix (": healthy"),
// which is cut.
func (r *Runtime) Events(ctx context.Context) (<-chan lifecycle.RuntimeEvent, <-chan error) {
	f := client.Filters{}.Add("type", "container").Add("label", LabelManaged+"=true")
	for k, v := range r.opts.Labels {
		f.Add("label", k+"="+v)
	}
	for _, a := range []string{"die", "oom", "destroy", "pause", "unpause", "start", "health_status"} {
		f.Add("event", a)
	}
	return follow(ctx, r.cli, f, "following docker events", func(msg events.Message) (lifecycle.RuntimeEvent, bool) {
		action, _, _ := strings.Cut(string(msg.Action), ":")
		id := msg.Actor.Attributes[LabelID]
		if !r.owns(id, msg.Actor.Attributes) {
			return lifecycle.RuntimeEvent{}, false // another instance's container
		}
		if action == "oom" {
			r.ooms.saw(id, time.Now()) // before the Manager's inspect it brings
		}
		return lifecycle.RuntimeEvent{SandboxID: id, Action: action}, true
	})
}

// HostInfo is what the engine tells of its host and of how it isolates
// containers.
type HostInfo struct {
	// CPUs and MemoryMB are the host's size.
	CPUs     int
	MemoryMB int64
	// Runtimes are the OCI runtimes the engine has (runc, runsc, …);
	// DefaultRuntime the one it uses when none is named.
	Runtimes       []string
	DefaultRuntime string
	// Seccomp is the engine's default seccomp profile ("default", a
	// custom path, "unconfined"), "" when the engine has no seccomp.
	Seccomp string
	// AppArmor, SELinux, Rootless and UserNS tell the engine's other
	// security options.
	AppArmor, SELinux, Rootless, UserNS bool
	// StorageDriver is the engine's storage driver (overlay2, …).
	StorageDriver string
}

// HostInfo reads the engine's HostInfo.
func (r *Runtime) HostInfo(ctx context.Context) (HostInfo, error) {
	res, err := r.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return HostInfo{}, classify("reading docker info", err, lifecycle.ErrUnavailable)
	}
	info := res.Info
	h := HostInfo{CPUs: info.NCPU, MemoryMB: info.MemTotal >> 20, DefaultRuntime: info.DefaultRuntime, StorageDriver: info.Driver}
	for name := range info.Runtimes {
		h.Runtimes = append(h.Runtimes, name)
	}
	slices.Sort(h.Runtimes)
	for _, opt := range info.SecurityOptions {
		// "name=seccomp,profile=default", "name=apparmor", …
		var name, profile string
		for kv := range strings.SplitSeq(opt, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "name":
				name = v
			case "profile":
				profile = v
			}
		}
		switch name {
		case "seccomp":
			h.Seccomp = cmp.Or(profile, "default")
		case "apparmor":
			h.AppArmor = true
		case "selinux":
			h.SELinux = true
		case "rootless":
			h.Rootless = true
		case "userns":
			h.UserNS = true
		}
	}
	return h, nil
}

// Ping implements lifecycle.Runtime.
func (r *Runtime) Ping(ctx context.Context) error {
	_, err := r.cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	return classify("pinging docker", err, lifecycle.ErrUnavailable)
}

// isTransient tells engine failures worth retrying (daemon unreachable,
// timeouts, 5xx) from answers about the sandbox itself.
func isTransient(err error) bool {
	return client.IsErrConnectionFailed(err) ||
		errors.Is(err, context.DeadlineExceeded) ||
		cerrdefs.IsUnavailable(err) ||
		cerrdefs.IsDeadlineExceeded(err)
}

// classify wraps an engine error with what was being done and with the
// lifecycle sentinel that decides what the Manager does next: ErrUnavailable
// for transient failures, notFound for a 404. The engine's words are an
// EngineError: the log's, not an API caller's.
func classify(doing string, err, notFound error) error {
	switch {
	case err == nil:
		return nil
	case isTransient(err):
		return fmt.Errorf("%s: %w: %w", doing, lifecycle.ErrUnavailable, lifecycle.EngineFailure(err))
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%s: %w: %w", doing, notFound, lifecycle.EngineFailure(err))
	default:
		return fmt.Errorf("%s: %w", doing, lifecycle.EngineFailure(err))
	}
}

// Interface guards.
var (
	_ lifecycle.VolumeInspector = (*Runtime)(nil)
	_ lifecycle.Runtime         = (*Runtime)(nil)
	_ lifecycle.EventSource     = (*Runtime)(nil)
	_ lifecycle.ImageChecker    = (*Runtime)(nil)
	_ lifecycle.NetworkRuntime  = (*Runtime)(nil)
)
