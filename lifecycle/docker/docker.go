// Package docker implements lifecycle.Runtime on the Docker Engine API.
package docker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/store"
)

// Labels every container and volume sandwake makes carries.
const (
	LabelManaged = "sandwake.managed"
	LabelID      = "sandwake.id"
)

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
	// UpstreamMode is UpstreamPublished (default) or UpstreamNetwork.
	UpstreamMode string
	// Network is the Docker network of UpstreamNetwork mode.
	Network string
	// StopTimeout is how long a stop waits for the app to exit before the
	// engine kills it. Default: 10s.
	StopTimeout time.Duration
	// Labels are added to every container and volume and narrow List to
	// them, so that several gateways (or test runs) share one engine.
	Labels map[string]string
}

// Runtime is a lifecycle.Runtime on a Docker Engine.
type Runtime struct {
	cli  *client.Client
	opts Options
}

// New connects a runtime to the engine (no request is made until used).
func New(opts Options) (*Runtime, error) {
	if opts.UpstreamMode == "" {
		opts.UpstreamMode = UpstreamPublished
	}
	switch opts.UpstreamMode {
	case UpstreamPublished:
	case UpstreamNetwork:
		if opts.Network == "" {
			return nil, errors.New("docker runtime: upstream mode network needs a network name")
		}
	default:
		return nil, fmt.Errorf("docker runtime: unknown upstream mode %q (published or network)", opts.UpstreamMode)
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 10 * time.Second
	}
	clientOpts := []client.Opt{client.FromEnv}
	if opts.Host != "" {
		clientOpts = append(clientOpts, client.WithHost(opts.Host))
	}
	cli, err := client.New(clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("docker runtime: %w", err)
	}
	return &Runtime{cli: cli, opts: opts}, nil
}

// Close releases the client's connections.
func (r *Runtime) Close() error { return r.cli.Close() }

// Client exposes the engine client (for reconcile's event stream and tests).
func (r *Runtime) Client() *client.Client { return r.cli }

// ContainerName is the name of sandbox id's container.
func ContainerName(id string) string { return "s-" + id }

// VolumeName is the name of sandbox id's workspace volume.
func VolumeName(id string) string { return "s-" + id + "-data" }

func (r *Runtime) labels(id string) map[string]string {
	l := maps.Clone(r.opts.Labels)
	if l == nil {
		l = make(map[string]string, 2)
	}
	l[LabelManaged] = "true"
	l[LabelID] = id
	return l
}

// Create implements lifecycle.Runtime.
func (r *Runtime) Create(ctx context.Context, id string, spec store.Spec) (lifecycle.Container, error) {
	if err := r.ensureImage(ctx, spec.Image); err != nil {
		return lifecycle.Container{}, err
	}
	if err := r.Remove(ctx, id); err != nil {
		return lifecycle.Container{}, err
	}
	labels := r.labels(id)
	if _, err := r.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: VolumeName(id), Labels: labels}); err != nil {
		return lifecycle.Container{}, classify("creating volume "+VolumeName(id), err, lifecycle.ErrNotFound)
	}

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
		if r.opts.UpstreamMode == UpstreamPublished {
			bindings[port] = []network.PortBinding{{HostIP: loopback}}
		}
	}
	cfg := &container.Config{
		Image:        spec.Image,
		Cmd:          spec.Cmd,
		Env:          env,
		ExposedPorts: exposed,
		Labels:       labels,
		Hostname:     ContainerName(id),
	}
	hc := &container.HostConfig{
		PortBindings: bindings,
		Mounts: []mount.Mount{{
			Type:   mount.TypeVolume,
			Source: VolumeName(id),
			Target: spec.WorkspacePath,
		}},
		SecurityOpt: []string{"no-new-privileges"},
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
	var nc *network.NetworkingConfig
	if r.opts.UpstreamMode == UpstreamNetwork {
		hc.NetworkMode = container.NetworkMode(r.opts.Network)
	}
	res, err := r.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: ContainerName(id), Config: cfg, HostConfig: hc, NetworkingConfig: nc,
	})
	if err != nil {
		return lifecycle.Container{}, classify("creating container "+ContainerName(id), err, lifecycle.ErrImageNotFound)
	}
	return lifecycle.Container{ID: res.ID, SandboxID: id, State: lifecycle.ContainerCreated}, nil
}

// ensureImage pulls image when the engine does not have it.
func (r *Runtime) ensureImage(ctx context.Context, image string) error {
	_, err := r.cli.ImageInspect(ctx, image)
	if err == nil {
		return nil
	}
	if !cerrdefs.IsNotFound(err) {
		return classify("inspecting image "+image, err, lifecycle.ErrImageNotFound)
	}
	pull, err := r.cli.ImagePull(ctx, image, client.ImagePullOptions{})
	if err == nil {
		err = pull.Wait(ctx)
	}
	if err != nil {
		if isTransient(err) {
			return classify("pulling image "+image, err, lifecycle.ErrImageNotFound)
		}
		return fmt.Errorf("%w: image %q is not on the engine and pulling it failed: %v", lifecycle.ErrImageNotFound, image, err)
	}
	return nil
}

// Start implements lifecycle.Runtime.
func (r *Runtime) Start(ctx context.Context, id string) (lifecycle.Container, error) {
	if _, err := r.cli.ContainerStart(ctx, ContainerName(id), client.ContainerStartOptions{}); err != nil {
		return lifecycle.Container{}, classify("starting container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
	}
	return r.Inspect(ctx, id)
}

// Pause implements lifecycle.Runtime.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	_, err := r.cli.ContainerPause(ctx, ContainerName(id), client.ContainerPauseOptions{})
	return classify("pausing container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
}

// Unpause implements lifecycle.Runtime.
func (r *Runtime) Unpause(ctx context.Context, id string) error {
	_, err := r.cli.ContainerUnpause(ctx, ContainerName(id), client.ContainerUnpauseOptions{})
	return classify("unpausing container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
}

// Stop implements lifecycle.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	secs := int(r.opts.StopTimeout / time.Second)
	_, err := r.cli.ContainerStop(ctx, ContainerName(id), client.ContainerStopOptions{Timeout: &secs})
	return classify("stopping container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
}

// Remove implements lifecycle.Runtime.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	_, err := r.cli.ContainerRemove(ctx, ContainerName(id), client.ContainerRemoveOptions{Force: true})
	if err != nil && cerrdefs.IsNotFound(err) {
		return nil
	}
	return classify("removing container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
}

// RemoveVolume implements lifecycle.Runtime. The size comes from the engine's
// disk-usage report, read just before removal.
func (r *Runtime) RemoveVolume(ctx context.Context, id string) (int64, error) {
	name := VolumeName(id)
	if _, err := r.cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{}); err != nil {
		return 0, classify("inspecting volume "+name, err, lifecycle.ErrNotFound)
	}
	var size int64
	du, err := r.cli.DiskUsage(ctx, client.DiskUsageOptions{Volumes: true, Verbose: true})
	if err != nil {
		return 0, classify("reading volume sizes", err, lifecycle.ErrNotFound)
	}
	for _, v := range du.Volumes.Items {
		if v.Name == name && v.UsageData != nil && v.UsageData.Size > 0 {
			size = v.UsageData.Size
		}
	}
	if _, err := r.cli.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true}); err != nil {
		return 0, classify("removing volume "+name, err, lifecycle.ErrNotFound)
	}
	return size, nil
}

// Inspect implements lifecycle.Runtime.
func (r *Runtime) Inspect(ctx context.Context, id string) (lifecycle.Container, error) {
	res, err := r.cli.ContainerInspect(ctx, ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		return lifecycle.Container{}, classify("inspecting container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
	}
	return r.fromInspect(id, &res.Container), nil
}

func (r *Runtime) fromInspect(id string, ci *container.InspectResponse) lifecycle.Container {
	c := lifecycle.Container{ID: ci.ID, SandboxID: id}
	if s := ci.State; s != nil {
		c.State = lifecycle.ContainerState(s.Status)
		c.ExitCode = s.ExitCode
		c.OOMKilled = s.OOMKilled
		c.StartedAt, _ = time.Parse(time.RFC3339Nano, s.StartedAt)
		c.FinishedAt, _ = time.Parse(time.RFC3339Nano, s.FinishedAt)
	}
	if ci.Config != nil {
		c.Upstreams = r.upstreams(id, ci)
	}
	return c
}

// upstreams reads the address of each exposed port: the published host port
// on loopback, or the container's name on the network.
func (r *Runtime) upstreams(id string, ci *container.InspectResponse) map[int]string {
	ups := make(map[int]string, len(ci.Config.ExposedPorts))
	for port := range ci.Config.ExposedPorts {
		p := int(port.Num())
		if r.opts.UpstreamMode == UpstreamNetwork {
			ups[p] = ContainerName(id) + ":" + strconv.Itoa(p)
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

// List implements lifecycle.Runtime.
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
	for _, s := range res.Items {
		out = append(out, lifecycle.Container{
			ID:        s.ID,
			SandboxID: s.Labels[LabelID],
			State:     lifecycle.ContainerState(s.State),
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
	res := r.cli.Events(ctx, client.EventsListOptions{Filters: f})
	out := make(chan lifecycle.RuntimeEvent)
	errs := make(chan error, 1)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-res.Err:
				if err == nil {
					err = errors.New("docker event stream ended")
				}
				errs <- classify("following docker events", err, lifecycle.ErrUnavailable)
				return
			case msg := <-res.Messages:
				action, _, _ := strings.Cut(string(msg.Action), ":")
				ev := lifecycle.RuntimeEvent{SandboxID: msg.Actor.Attributes[LabelID], Action: action}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, errs
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
// for transient failures, notFound for a 404.
func classify(doing string, err, notFound error) error {
	switch {
	case err == nil:
		return nil
	case isTransient(err):
		return fmt.Errorf("%s: %w: %v", doing, lifecycle.ErrUnavailable, err)
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%s: %w: %v", doing, notFound, err)
	default:
		return fmt.Errorf("%s: %w", doing, err)
	}
}

// Interface guards.
var (
	_ lifecycle.Runtime     = (*Runtime)(nil)
	_ lifecycle.EventSource = (*Runtime)(nil)
)
