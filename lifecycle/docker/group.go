package docker

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file runs a sandbox with services as a group, in Kubernetes' pod
// style: an infra container (infra.go) owns the group's network namespace
// and everything Docker keeps on the namespace's owner (the sandbox's
// address, its DNS server, published ports, hostname, the MAC the
// anti-spoofing binding holds); each service and the app join it
// (network mode container:<infra>), so they reach each other on
// localhost, and stopping or starting any of them never takes the network
// from the others. Members carry the sandbox's labels and LabelMember, so
// List skips them and ownership holds for each.

// Labels of a group's members.
const (
	// LabelMember is a member's name: "net" for the infra container, a
	// service's name otherwise. The app carries none.
	LabelMember = "sandwake.member"
	// LabelGroup marks the app container of a group.
	LabelGroup = "sandwake.group"
	// LabelMemberOrder is a member's place in the start order (the infra
	// container 0, the services from 1 in depends_on order).
	LabelMemberOrder = "sandwake.member.order"
	// LabelMemberReady is a service's ready probe.
	LabelMemberReady = "sandwake.member.ready"
	// LabelGroupServices, on a group's app, names its services (sorted,
	// comma-separated): what a group missing one (removed behind
	// sandwake's back) is told by. Apps made before it carry none.
	LabelGroupServices = "sandwake.group.services"
	infraMember        = "net"
)

// MemberName is the container name of member of sandbox id's group.
func MemberName(id, member string) string { return "s-" + id + "--" + member }

// MemberVolumeName is the workspace volume of service svc of sandbox id.
func MemberVolumeName(id, svc string) string { return "s-" + id + "--" + svc + "-data" }

// member is one container of a group, as the engine lists it.
type member struct {
	name  string
	cid   string
	order int
	ready string
	state string
}

// members lists sandbox id's group members that are this instance's, in
// start order (the infra container first).
func (r *Runtime) members(ctx context.Context, id string) ([]member, error) {
	f := client.Filters{}.Add("label", LabelID+"="+id).Add("label", LabelMember)
	res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, classify("listing the members of "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
	}
	var out []member
	for _, s := range res.Items {
		if !r.owns(id, s.Labels) {
			continue
		}
		order, _ := strconv.Atoi(s.Labels[LabelMemberOrder])
		out = append(out, member{name: s.Labels[LabelMember], cid: s.ID, order: order, ready: s.Labels[LabelMemberReady], state: string(s.State)})
	}
	slices.SortFunc(out, func(a, b member) int { return a.order - b.order })
	return out, nil
}

// missingService is the first service the app's labels name
// (LabelGroupServices) that ms lacks, "" when none is.
func missingService(appLabels map[string]string, ms []member) string {
	v := appLabels[LabelGroupServices]
	if v == "" {
		return ""
	}
	for name := range strings.SplitSeq(v, ",") {
		if !slices.ContainsFunc(ms, func(m member) bool { return m.name == name }) {
			return name
		}
	}
	return ""
}

// errMissingService says a group lacks a service's container: to the
// Manager the group's container is gone (ErrContainerNotFound), so that
// reconcile stops what is left of it and the next wake makes it again
// (its volumes kept).
func errMissingService(id, name string) error {
	return fmt.Errorf("%w (%w): the container %s of service %s", lifecycle.ErrContainerNotFound, lifecycle.ErrGroupIncomplete, MemberName(id, name), name)
}

// isGroup reports whether sandbox id's container is a group's app.
func (r *Runtime) isGroup(ctx context.Context, id string) (bool, error) {
	if v, ok := r.groups.Load(id); ok {
		return v.(bool), nil
	}
	res, err := r.cli.ContainerInspect(ctx, ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		return false, classify("inspecting container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
	}
	if !r.ownsContainer(id, &res.Container) {
		return false, nil // not this instance's: the operation itself refuses it
	}
	g := containerLabels(&res.Container)[LabelGroup] == "true"
	r.groups.Store(id, g)
	return g, nil
}

// removeMembers removes sandbox id's members (a recreate, a destroy); their
// volumes stay.
func (r *Runtime) removeMembers(ctx context.Context, id string) error {
	ms, err := r.members(ctx, id)
	if err != nil {
		return err
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if _, err := r.cli.ContainerRemove(ctx, ms[i].cid, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return classify("removing container "+MemberName(id, ms[i].name), err, lifecycle.ErrContainerNotFound)
		}
	}
	return nil
}

// createGroup makes the infra container (with the address, DNS, ports and
// hostname an app container would have had) and the services, in start
// order, each with a volume of its own. On failure what it made is removed,
// the volumes it made with the containers. It returns the infra
// container's engine id, whose namespace the app joins, and the volumes it
// made (for the caller to remove if the app's create fails).
func (r *Runtime) createGroup(ctx context.Context, id string, spec lifecycle.Spec, labels map[string]string, ports network.PortSet, bindings network.PortMap, dns []netip.Addr) (infraID string, madeVolumes []string, err error) {
	order, err := lifecycle.ServiceOrder(spec.Services)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %v", lifecycle.ErrInvalid, err)
	}
	for _, name := range order {
		if err := r.ensureImage(ctx, spec.Services[name].Image); err != nil {
			return "", nil, &lifecycle.ServiceError{Service: name, Err: err}
		}
	}
	ref, err := r.ensureInfraImage(ctx)
	if err != nil {
		return "", nil, err
	}
	var made, volumes []string // (the named results are nil on a failure's return)
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			for _, cid := range slices.Backward(made) {
				r.cli.ContainerRemove(rctx, cid, client.ContainerRemoveOptions{Force: true})
			}
			r.removeVolumes(rctx, volumes)
		}
	}()
	memberLabels := func(name string, order int, ready string) map[string]string {
		l := maps.Clone(labels)
		l[LabelMember] = name
		l[LabelMemberOrder] = strconv.Itoa(order)
		if ready != "" {
			l[LabelMemberReady] = ready
		}
		return l
	}
	infra := client.ContainerCreateOptions{
		Name:   MemberName(id, infraMember),
		Config: &container.Config{Image: ref, Labels: memberLabels(infraMember, 0, ""), Hostname: ContainerName(id), ExposedPorts: ports, StopSignal: "SIGKILL"},
		HostConfig: &container.HostConfig{
			PortBindings: bindings, DNS: dns,
			NetworkMode:    container.NetworkMode(r.opts.SandboxNetwork),
			SecurityOpt:    []string{"no-new-privileges"},
			CapDrop:        []string{"ALL"},
			ReadonlyRootfs: true,
			Resources:      container.Resources{Memory: infraMemoryMB << 20, MemorySwap: infraMemoryMB << 20, PidsLimit: ptr(int64(4))},
			LogConfig:      container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "1m", "max-file": "1"}},
		},
	}
	if r.opts.UpstreamMode == UpstreamNetwork {
		infra.HostConfig.NetworkMode = container.NetworkMode(r.opts.Network)
	}
	if spec.Address.IsValid() && r.ownsNetwork() {
		infra.NetworkingConfig = &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
			r.opts.SandboxNetwork: {IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: spec.Address}},
		}}
	}
	res, err := r.cli.ContainerCreate(ctx, infra)
	if err != nil {
		return "", nil, classify("creating container "+MemberName(id, infraMember), err, lifecycle.ErrImageNotFound)
	}
	made = append(made, res.ID)
	infraID = res.ID
	for i, name := range order {
		svc := spec.Services[name]
		vol := MemberVolumeName(id, name)
		madeVol, err := r.ensureVolume(ctx, id, vol, labels, spec, true)
		if err != nil {
			return "", nil, &lifecycle.ServiceError{Service: name, Err: err}
		}
		if madeVol {
			volumes = append(volumes, vol)
		}
		env := make([]string, 0, len(svc.Env))
		for _, k := range slices.Sorted(maps.Keys(svc.Env)) {
			env = append(env, k+"="+svc.Env[k])
		}
		hc := &container.HostConfig{
			NetworkMode: container.NetworkMode("container:" + infraID),
			Mounts:      []mount.Mount{{Type: mount.TypeVolume, Source: vol, Target: svc.WorkspacePath}},
			SecurityOpt: []string{"no-new-privileges"},
			CapDrop:     []string{"ALL"},
			CapAdd:      append(slices.Clone(lifecycle.SandboxCapabilities), spec.CapAdd...),
			Runtime:     spec.Runtime,
			LogConfig:   container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "10m", "max-file": "2"}},
		}
		hc.Ulimits = []*container.Ulimit{{Name: "nofile", Soft: r.opts.Nofile, Hard: r.opts.Nofile}}
		if svc.MemoryMB > 0 {
			hc.Memory = svc.MemoryMB << 20
			hc.MemorySwap = hc.Memory
		}
		if svc.CPUs > 0 {
			hc.NanoCPUs = int64(svc.CPUs * 1e9)
		}
		if spec.PidsLimit > 0 {
			hc.PidsLimit = ptr(spec.PidsLimit)
		}
		if svc.DiskMB > 0 && !r.noQuota.Load() {
			hc.StorageOpt = map[string]string{"size": fmt.Sprintf("%dm", svc.DiskMB)}
		}
		opts := client.ContainerCreateOptions{Name: MemberName(id, name), HostConfig: hc,
			Config: &container.Config{Image: svc.Image, Cmd: svc.Cmd, Env: env, Labels: memberLabels(name, i+1, svc.Ready)}}
		res, err := r.cli.ContainerCreate(ctx, opts)
		if err != nil && hc.StorageOpt != nil {
			hc.StorageOpt = nil
			res, err = r.cli.ContainerCreate(ctx, opts)
		}
		if err != nil {
			return "", nil, &lifecycle.ServiceError{Service: name, Err: classify("creating container "+MemberName(id, name), err, lifecycle.ErrImageNotFound)}
		}
		made = append(made, res.ID)
	}
	return infraID, volumes, nil
}

// infraMemoryMB bounds the infra container's memory. Its program holds a
// few pages, but runc's init runs in the container's cgroup until the
// program starts: its peak was 4.1 MB idle and 4.6 MB on a loaded host,
// and at Docker's smallest limit (6 MB) a start on a loaded CI host died
// between runc's create and start ("cannot start a stopped process"). A
// limit is a ceiling, not a reservation: the margin costs nothing.
const infraMemoryMB = 32

func ptr[T any](v T) *T { return &v }

// removeVolumes removes the volumes a failed create made (its own, just
// made: no label to check), as far as it can.
func (r *Runtime) removeVolumes(ctx context.Context, names []string) {
	for _, name := range names {
		r.cli.VolumeRemove(ctx, name, client.VolumeRemoveOptions{})
	}
}

// ensureVolume makes volume name of sandbox id, or checks that the one
// under that name is this instance's; made says it made it. With owner (a
// service's volume) a kept volume must also be the spec's owner's, as
// the lifecycle checks the app's before a create (security III's
// re-create check). Creating a volume under an existing name returns that
// volume, so its labels are checked again: another gateway may have made
// it between the inspect and the create.
func (r *Runtime) ensureVolume(ctx context.Context, id, name string, labels map[string]string, spec lifecycle.Spec, owner bool) (made bool, err error) {
	vol, err := r.cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
	switch {
	case err == nil:
		if !r.owns(id, vol.Volume.Labels) {
			return false, notOurs("volume", name, vol.Volume.Labels, lifecycle.ErrIDTaken)
		}
		if inc := vol.Volume.Labels[LabelOwnerIncarnation]; owner && inc != "" && spec.Incarnation != "" && inc != spec.Incarnation && !sameOwner(vol.Volume.Labels, spec) {
			return false, fmt.Errorf("%w: volume %s was kept for another owner", lifecycle.ErrIDTaken, name)
		}
		return false, nil
	case cerrdefs.IsNotFound(err):
		res, err := r.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: name, Labels: volumeLabels(labels, spec)})
		if err != nil {
			return false, classify("creating volume "+name, err, lifecycle.ErrNotFound)
		}
		if !r.owns(id, res.Volume.Labels) {
			return false, notOurs("volume", name, res.Volume.Labels, lifecycle.ErrIDTaken)
		}
		return true, nil
	default:
		return false, classify("inspecting volume "+name, err, lifecycle.ErrNotFound)
	}
}

// sameOwner reports whether a kept volume's owner labels are the spec's
// labels (the tenant of the sandbox re-creating the id).
func sameOwner(l map[string]string, spec lifecycle.Spec) bool {
	for k, v := range l {
		if rest, ok := strings.CutPrefix(k, LabelOwnerPrefix); ok && spec.Labels[rest] != v {
			return false
		}
	}
	return true
}

// startGroup starts what is not running of sandbox id's group, in order:
// the infra container, then each service, ready (its probe run inside
// the group's network namespace) before the next. A service that does not
// start or become ready is a *lifecycle.ServiceError.
func (r *Runtime) startGroup(ctx context.Context, id string) error {
	ms, err := r.members(ctx, id)
	if err != nil {
		return err
	}
	if len(ms) == 0 || ms[0].name != infraMember {
		return fmt.Errorf("%w: the network container %s of the group is missing", lifecycle.ErrContainerNotFound, MemberName(id, infraMember))
	}
	app, err := r.cli.ContainerInspect(ctx, ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		return classify("inspecting container "+ContainerName(id), err, lifecycle.ErrContainerNotFound)
	}
	if !r.ownsContainer(id, &app.Container) {
		return notOurs("container", ContainerName(id), containerLabels(&app.Container), lifecycle.ErrContainerNotFound)
	}
	if name := missingService(containerLabels(&app.Container), ms); name != "" {
		return errMissingService(id, name)
	}
	var pid int
	for _, m := range ms {
		switch m.state {
		case string(container.StateRunning):
		case string(container.StatePaused):
			if _, err := r.cli.ContainerUnpause(ctx, m.cid, client.ContainerUnpauseOptions{}); err != nil {
				return wrapMember(m, classify("unpausing container "+MemberName(id, m.name), err, lifecycle.ErrContainerNotFound))
			}
		default:
			if _, err := r.cli.ContainerStart(ctx, m.cid, client.ContainerStartOptions{}); err != nil {
				return wrapMember(m, classify("starting container "+MemberName(id, m.name), err, lifecycle.ErrContainerNotFound))
			}
		}
		if m.name == infraMember {
			ci, err := r.cli.ContainerInspect(ctx, m.cid, client.ContainerInspectOptions{})
			if err != nil {
				return fmt.Errorf("the network container %s of the group is not running: %w", MemberName(id, infraMember), lifecycle.EngineFailure(err))
			}
			if ci.Container.State == nil || ci.Container.State.Pid == 0 {
				return fmt.Errorf("the network container %s of the group is not running", MemberName(id, infraMember))
			}
			pid = ci.Container.State.Pid
			continue
		}
		if err := r.waitMember(ctx, id, m, pid); err != nil {
			return &lifecycle.ServiceError{Service: m.name, Err: err}
		}
	}
	return nil
}

func wrapMember(m member, err error) error {
	if m.name == infraMember {
		return err
	}
	return &lifecycle.ServiceError{Service: m.name, Err: err}
}

// waitMember waits for service m to pass its ready probe inside the
// network namespace of process pid, failing at once when it exits.
func (r *Runtime) waitMember(ctx context.Context, id string, m member, pid int) error {
	mode, port, path, err := lifecycle.ParseReady(m.ready)
	if err != nil || mode == "" {
		return err
	}
	var last error
	for attempt := 0; ; attempt++ {
		if last = probeInNetns(ctx, pid, mode, port, path); last == nil {
			return nil
		}
		if attempt%5 == 4 {
			ci, err := r.cli.ContainerInspect(ctx, m.cid, client.ContainerInspectOptions{})
			if err == nil && ci.Container.State != nil && !ci.Container.State.Running {
				return fmt.Errorf("exited (%d) before it was ready (%s): %v", ci.Container.State.ExitCode, m.ready, last)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready (%s): %v", m.ready, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probeInNetns runs one ready probe against 127.0.0.1:port inside the
// network namespace of process pid: a connect (tcp), or a GET of path
// answered below 500 (http). The socket is made inside the namespace on a
// thread of its own; the exchange runs from anywhere after.
func probeInNetns(ctx context.Context, pid int, mode string, port int, path string) error {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{err: lifecycle.EngineFailure(err)}
			return
		}
		defer orig.Close()
		target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			// The host's pid and the gateway's privileges are the log's,
			// not an API caller's (lifecycle.PublicMessage).
			ch <- result{err: lifecycle.EngineFailure(fmt.Errorf("the group's network namespace: %w (the gateway needs the host's process namespace)", err))}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: lifecycle.EngineFailure(fmt.Errorf("entering the group's network namespace: %w (the gateway needs CAP_SYS_ADMIN for services' probes)", err))}
			return
		}
		d := net.Dialer{Timeout: 500 * time.Millisecond}
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port)).String())
		ch <- result{c, err}
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread() // else the thread dies with the goroutine
		}
	}()
	res := <-ch
	if res.err != nil {
		return res.err
	}
	defer res.c.Close()
	if mode == lifecycle.ReadyTCP {
		return nil
	}
	res.c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintf(res.c, "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path); err != nil {
		return err
	}
	line, err := bufio.NewReader(res.c).ReadString('\n')
	if err != nil {
		return err
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return fmt.Errorf("answered %q", strings.TrimSpace(line))
	}
	if code, err := strconv.Atoi(f[1]); err != nil || code >= 500 {
		return fmt.Errorf("answered %s", strings.TrimSpace(line))
	}
	return nil
}

// groupDo runs op on each member of sandbox id's group, in start order or
// (reverse) the other way; the first error is returned after all ran.
func (r *Runtime) groupDo(ctx context.Context, id string, reverse, servicesOnly bool, doing string, op func(cid string) error) error {
	ms, err := r.members(ctx, id)
	if err != nil {
		return err
	}
	if reverse {
		slices.Reverse(ms)
	}
	var first error
	for _, m := range ms {
		if servicesOnly && m.name == infraMember {
			continue
		}
		if err := op(m.cid); err != nil && !cerrdefs.IsNotFound(err) && first == nil {
			first = classify(doing+" "+MemberName(id, m.name), err, lifecycle.ErrContainerNotFound)
		}
	}
	return first
}

// memberStates fills c with the group's view: the members' states, and
// the infra container's process, MAC and upstreams (the namespace's). An
// app running beside a member that is not is reported exited, so that
// reconcile corrects the group.
func (r *Runtime) memberStates(ctx context.Context, id string, appLabels map[string]string, c *lifecycle.Container) error {
	ms, err := r.members(ctx, id)
	if err != nil {
		return err
	}
	if name := missingService(appLabels, ms); name != "" {
		return errMissingService(id, name)
	}
	c.Members = map[string]lifecycle.ContainerState{}
	var broken *member
	for i, m := range ms {
		if m.name == infraMember {
			ci, err := r.cli.ContainerInspect(ctx, m.cid, client.ContainerInspectOptions{})
			if err != nil {
				return classify("inspecting container "+MemberName(id, m.name), err, lifecycle.ErrContainerNotFound)
			}
			// What the namespace's owner holds is the group's.
			infra := r.fromInspect(id, &ci.Container)
			c.Pid, c.MAC, c.Upstreams, c.Published, c.DNSForwarded = infra.Pid, infra.MAC, infra.Upstreams, infra.Published, infra.DNSForwarded
		} else {
			c.Members[m.name] = lifecycle.ContainerState(m.state)
		}
		if m.state != string(container.StateRunning) && broken == nil {
			broken = &ms[i]
		}
	}
	if len(ms) == 0 {
		broken = &member{name: infraMember, state: "missing"}
	}
	if broken != nil && c.State == lifecycle.ContainerRunning {
		c.State = lifecycle.ContainerExited
		c.ExitCode = -1
		if ci, err := r.cli.ContainerInspect(ctx, broken.cid, client.ContainerInspectOptions{}); err == nil && ci.Container.State != nil {
			c.ExitCode = ci.Container.State.ExitCode
		}
	}
	return nil
}
