package docker_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
	"github.com/sandwake/sandwake/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// counting wraps the real runtime and counts the calls that change a
// container, so tests can assert what reached the engine.
type counting struct {
	lifecycle.Runtime
	creates, starts, unpauses atomic.Int64
}

// Direct and UpstreamMode pass the runtime's upstream mode through.
func (c *counting) Direct() bool { return c.Runtime.(*docker.Runtime).Direct() }

func (c *counting) UpstreamMode(ctx context.Context) (string, string) {
	return c.Runtime.(*docker.Runtime).UpstreamMode(ctx)
}

// DiskUsage passes the disk watchdog's measures through.
func (c *counting) DiskUsage(ctx context.Context, id string) (int64, error) {
	return c.Runtime.(lifecycle.DiskMeter).DiskUsage(ctx, id)
}

// GroupDiskUsage passes the measures of a group's services through.
func (c *counting) GroupDiskUsage(ctx context.Context, id string) (int64, map[string]int64, error) {
	return c.Runtime.(lifecycle.GroupDiskMeter).GroupDiskUsage(ctx, id)
}

func (c *counting) Create(ctx context.Context, id string, spec lifecycle.Spec) (lifecycle.Container, error) {
	c.creates.Add(1)
	return c.Runtime.Create(ctx, id, spec)
}

func (c *counting) Start(ctx context.Context, id string) (lifecycle.Container, error) {
	c.starts.Add(1)
	return c.Runtime.Start(ctx, id)
}

func (c *counting) Unpause(ctx context.Context, id string) error {
	c.unpauses.Add(1)
	return c.Runtime.Unpause(ctx, id)
}

type fixture struct {
	t     testing.TB
	cli   *client.Client
	image string
	store *store.Store
	rt    *counting
	m     *lifecycle.Manager
	// events are the event hooks tests add after the manager is built (its
	// own OnEvent, fixed at construction, calls them under the lock).
	mu     sync.Mutex
	events []func(lifecycle.Event)
}

// onEvent adds an event hook.
func (f *fixture) onEvent(fn func(lifecycle.Event)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, fn)
}

func (f *fixture) event(ev lifecycle.Event) {
	f.mu.Lock()
	fns := slices.Clone(f.events)
	f.mu.Unlock()
	for _, fn := range fns {
		fn(ev)
	}
}

func newFixture(t testing.TB, cfg lifecycle.Config) *fixture {
	t.Helper()
	return newFixtureWith(t, cfg, nil)
}

// newFixtureWith is newFixture with the runtime's options changed by opt.
func newFixtureWith(t testing.TB, cfg lifecycle.Config, opt func(*docker.Options)) *fixture {
	t.Helper()
	cli := testenv.Docker(t)
	image := testenv.TestAppImage(t)
	st, err := store.Open(store.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	opts := docker.Options{
		Labels: testenv.Labels(), StopTimeout: 5 * time.Second, Instance: "t" + testenv.RunID(), SandboxNetwork: testenv.Network(),
		Legacy: func(id string) bool {
			rec, err := st.Get(id)
			return err == nil && rec.Incarnation == ""
		},
	}
	if opt != nil {
		opt(&opts)
	}
	real, err := docker.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { real.Close() })
	rt := &counting{Runtime: real}
	f := &fixture{t: t, cli: cli, image: image, store: st, rt: rt}
	if cfg.OnEvent == nil {
		cfg.OnEvent = f.event
	}
	m, err := lifecycle.NewManager(st, rt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	f.m = m
	return f
}

// create makes a running sandbox and registers the removal of its container
// and volume.
func (f *fixture) create(spec lifecycle.Spec) lifecycle.Record {
	f.t.Helper()
	id := testenv.UniqueID("t")
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		f.cli.ContainerRemove(ctx, docker.ContainerName(id), client.ContainerRemoveOptions{Force: true})
		f.cli.VolumeRemove(ctx, docker.VolumeName(id), client.VolumeRemoveOptions{Force: true})
	})
	if spec.Image == "" {
		spec.Image = f.image
	}
	if len(spec.Ports) == 0 {
		spec.Ports = []int{8080}
	}
	rec, err := f.m.Create(context.Background(), lifecycle.CreateRequest{ID: id, Spec: spec})
	if err != nil {
		f.t.Fatalf("create: %v", err)
	}
	return rec
}

func get(t testing.TB, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s%s: %v", addr, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func mustState(t testing.TB, st *store.Store, id string, want lifecycle.State) lifecycle.Record {
	t.Helper()
	rec, err := st.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != want {
		t.Fatalf("sandbox %s is %s (%s), want %s", id, rec.State, rec.Error, want)
	}
	return rec
}

// upstreamOf is where port 8080 of an inspected container answers now: its
// port published on loopback, or its address on the tests' network.
func upstreamOf(ci *container.InspectResponse) string {
	for _, b := range ci.NetworkSettings.Ports[network.MustParsePort("8080/tcp")] {
		return "127.0.0.1:" + b.HostPort
	}
	if ep := ci.NetworkSettings.Networks[testenv.Network()]; ep != nil && ep.IPAddress.IsValid() {
		return netip.AddrPortFrom(ep.IPAddress.Unmap(), 8080).String()
	}
	return ""
}

// upstream is the address the gateway dials for rec's first port: the
// sandbox's own address (upstream mode direct, this machine's), or a port
// published on loopback.
func upstream(t testing.TB, rec lifecycle.Record) string {
	t.Helper()
	addr := rec.Upstreams[rec.Spec.Ports[0]]
	ap, err := netip.ParseAddrPort(addr)
	switch {
	case err != nil:
		t.Fatalf("upstream %q is not an address and port", addr)
	case rec.Address.IsValid() && ap.Addr() != rec.Address:
		t.Fatalf("upstream %q is not at the sandbox's address %s", addr, rec.Address)
	case !ap.Addr().IsLoopback() && !ap.Addr().IsPrivate():
		t.Fatalf("upstream %q is neither a published port on loopback nor an address of the sandbox network", addr)
	}
	return addr
}

func TestCreateRunsAndAnswers(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{Ports: []int{8080, 9000}, Env: map[string]string{"EXTRA_PORTS": "9000"}, MemoryMB: 64})
	mustState(t, f.store, rec.ID, lifecycle.Running)
	if code, body := get(t, upstream(t, rec), "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	if code, _ := get(t, rec.Upstreams[9000], "/healthz"); code != 200 {
		t.Fatalf("second port: %d", code)
	}
	ci, err := f.cli.ContainerInspect(context.Background(), docker.ContainerName(rec.ID), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := ci.Container
	if c.Config.Labels[docker.LabelManaged] != "true" || c.Config.Labels[docker.LabelID] != rec.ID {
		t.Fatalf("labels: %v", c.Config.Labels)
	}
	if c.HostConfig.Memory != 64<<20 || c.HostConfig.PidsLimit == nil || *c.HostConfig.PidsLimit != lifecycle.DefaultPidsLimit {
		t.Fatalf("limits: memory %d pids %v", c.HostConfig.Memory, c.HostConfig.PidsLimit)
	}
	if len(c.HostConfig.SecurityOpt) != 1 || c.HostConfig.SecurityOpt[0] != "no-new-privileges" {
		t.Fatalf("security opts: %v", c.HostConfig.SecurityOpt)
	}
	if len(c.Mounts) != 1 || c.Mounts[0].Name != docker.VolumeName(rec.ID) || c.Mounts[0].Destination != "/workspace" {
		t.Fatalf("mounts: %+v", c.Mounts)
	}
	h, _ := f.store.History(rec.ID)
	if len(h) != 2 || h[0].To != lifecycle.Creating || h[1].To != lifecycle.Running {
		t.Fatalf("history: %+v", h)
	}
}

func TestPauseStopAndWake(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{})
	ctx := context.Background()

	if _, err := f.m.Pause(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	mustState(t, f.store, rec.ID, lifecycle.Paused)
	ci, _ := f.cli.ContainerInspect(ctx, docker.ContainerName(rec.ID), client.ContainerInspectOptions{})
	if !ci.Container.State.Paused {
		t.Fatal("container not paused in docker")
	}
	woke, err := f.m.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if woke.State != lifecycle.Running || f.rt.unpauses.Load() != 1 {
		t.Fatalf("after wake from paused: %s, %d unpauses", woke.State, f.rt.unpauses.Load())
	}
	if code, _ := get(t, upstream(t, woke), "/healthz"); code != 200 {
		t.Fatalf("after unpause: %d", code)
	}
	// At its own address, an unpaused app is not probed by a connect (the
	// kernel accepts on a frozen process's socket: it proved nothing).
	if ph, ok := f.m.LastWake(rec.ID); !ok || (f.rt.Direct() && ph.Ready != 0) {
		t.Fatalf("wake from paused: phases %+v (%v), want no readiness probe in direct mode", ph, ok)
	}

	if _, err := f.m.Stop(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	stopped := mustState(t, f.store, rec.ID, lifecycle.Stopped)
	if stopped.StoppedAt.IsZero() {
		t.Fatal("stopped_at not set")
	}
	woke, err = f.m.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The host port (published), or the address Docker gave a container
	// without a fixed one (direct), may differ after a start; the record
	// must carry the one docker reports now.
	ci, _ = f.cli.ContainerInspect(ctx, docker.ContainerName(rec.ID), client.ContainerInspectOptions{})
	now := upstreamOf(&ci.Container)
	if woke.Upstreams[8080] != now {
		t.Fatalf("upstream %q, docker says %q", woke.Upstreams[8080], now)
	}
	if code, _ := get(t, upstream(t, woke), "/healthz"); code != 200 {
		t.Fatalf("after start: %d", code)
	}
	if ph, ok := f.m.LastWake(rec.ID); !ok || ph.Ready <= 0 {
		t.Fatalf("wake from stopped: phases %+v (%v), want a readiness probe", ph, ok)
	}
	if f.rt.starts.Load() != 2 { // create + wake
		t.Fatalf("starts = %d, want 2", f.rt.starts.Load())
	}
	h, _ := f.store.History(rec.ID)
	var got []string
	for _, e := range h {
		got = append(got, string(e.To))
	}
	if want := "creating running paused running stopped running"; strings.Join(got, " ") != want {
		t.Fatalf("history %q, want %q", strings.Join(got, " "), want)
	}
}

func TestWakeRecreatesRemovedContainerKeepingWorkspace(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{})
	ctx := context.Background()
	addr := upstream(t, rec)

	req, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/files/note.txt", strings.NewReader("kept across recreate"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT file: %v %v", err, resp)
	}
	resp.Body.Close()

	// Behind sandwake's back, as `docker rm -f` would.
	if _, err := f.cli.ContainerRemove(ctx, docker.ContainerName(rec.ID), client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	// The record still says running; a stop finds no container and the
	// wake after it must recreate.
	if _, err := f.m.Stop(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	woke, err := f.m.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if f.rt.creates.Load() != 2 {
		t.Fatalf("creates = %d, want 2 (create + recreate)", f.rt.creates.Load())
	}
	if woke.ContainerID == rec.ContainerID {
		t.Fatal("container id unchanged after recreate")
	}
	code, body := get(t, upstream(t, woke), "/files/note.txt")
	if code != 200 || body != "kept across recreate" {
		t.Fatalf("file after recreate: %d %q", code, body)
	}
	h, _ := f.store.History(rec.ID)
	if last := h[len(h)-1]; last.To != lifecycle.Running || last.Reason != "recreate" {
		t.Fatalf("last event %+v, want running/recreate", last)
	}
}

func TestKilledSandboxIsRecreated(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{})
	ctx := context.Background()
	f.cli.ContainerRemove(ctx, docker.ContainerName(rec.ID), client.ContainerRemoveOptions{Force: true})
	// What reconcile will record when it sees the container gone.
	if _, _, err := f.store.Transition(rec.ID, lifecycle.AllowedFrom(lifecycle.Killed), lifecycle.Killed, "container_missing", nil); err != nil {
		t.Fatal(err)
	}
	woke, err := f.m.Wake(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, upstream(t, woke), "/healthz"); code != 200 {
		t.Fatalf("after recreate: %d", code)
	}
}

func TestConcurrentWakesStartOnce(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{Env: map[string]string{"STARTUP_DELAY": "300ms"}})
	ctx := context.Background()
	if _, err := f.m.Stop(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	startsBefore := f.rt.starts.Load()

	// A caller that gives up at once must not cancel the wake it started.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := f.m.Wake(gone, rec.ID); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", err)
	}

	const n = 200
	var (
		wg      sync.WaitGroup
		running atomic.Int64
		errs    = make(chan error, n)
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := f.m.Wake(ctx, rec.ID)
			if err != nil {
				errs <- err
				return
			}
			if r.State == lifecycle.Running {
				running.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if running.Load() != n {
		t.Fatalf("%d of %d wakes returned running", running.Load(), n)
	}
	if got := f.rt.starts.Load() - startsBefore; got != 1 {
		t.Fatalf("docker start called %d times, want exactly 1", got)
	}
	woke := mustState(t, f.store, rec.ID, lifecycle.Running)
	if code, _ := get(t, upstream(t, woke), "/healthz"); code != 200 {
		t.Fatalf("after storm: %d", code)
	}
}

func TestDestroyKeepsVolumePurgeFreesIt(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{})
	ctx := context.Background()
	payload := strings.Repeat("x", 1<<20)
	req, _ := http.NewRequest(http.MethodPut, "http://"+upstream(t, rec)+"/files/blob", strings.NewReader(payload))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT: %v %v", err, resp)
	}
	resp.Body.Close()

	if err := f.m.Destroy(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Get(rec.ID); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("record after destroy: %v", err)
	}
	if _, err := f.cli.ContainerInspect(ctx, docker.ContainerName(rec.ID), client.ContainerInspectOptions{}); err == nil {
		t.Fatal("container still there after destroy")
	}
	if _, err := f.cli.VolumeInspect(ctx, docker.VolumeName(rec.ID), client.VolumeInspectOptions{}); err != nil {
		t.Fatalf("volume gone after destroy: %v", err)
	}

	freed, err := f.m.Purge(ctx, rec.ID, "api")
	if err != nil {
		t.Fatal(err)
	}
	if freed < int64(len(payload)) {
		t.Fatalf("purge freed %d bytes, want at least %d", freed, len(payload))
	}
	if _, err := f.cli.VolumeInspect(ctx, docker.VolumeName(rec.ID), client.VolumeInspectOptions{}); err == nil {
		t.Fatal("volume still there after purge")
	}
	if _, err := f.m.Purge(ctx, rec.ID, "api"); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("second purge: %v", err)
	}
	h, _ := f.store.History(rec.ID)
	if h[len(h)-2].Type != lifecycle.EventDestroyed || h[len(h)-1].Type != lifecycle.EventPurged {
		t.Fatalf("history: %+v", h)
	}
}

func TestInvalidTransitionsChangeNothing(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{})
	ctx := context.Background()
	if _, err := f.m.Stop(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	before, _ := f.store.EventsAfter(0, 0)
	if _, err := f.m.Pause(ctx, rec.ID, "api"); !errors.Is(err, lifecycle.ErrConflict) {
		t.Fatalf("pause of stopped: %v, want ErrConflict", err)
	}
	ci, _ := f.cli.ContainerInspect(ctx, docker.ContainerName(rec.ID), client.ContainerInspectOptions{})
	if ci.Container.State.Status != "exited" {
		t.Fatalf("container is %s after refused pause", ci.Container.State.Status)
	}
	after, _ := f.store.EventsAfter(0, 0)
	if len(after) != len(before) {
		t.Fatalf("refused transition wrote %d events", len(after)-len(before))
	}
	mustState(t, f.store, rec.ID, lifecycle.Stopped)
}

func TestUnreachableDaemonLeavesRecord(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	rec := f.create(lifecycle.Spec{})
	ctx := context.Background()
	if _, err := f.m.Stop(ctx, rec.ID, "api"); err != nil {
		t.Fatal(err)
	}
	f.m.Close()
	before, _ := f.store.EventsAfter(0, 0)

	sock := "unix:///nonexistent-" + testenv.RunID() + "/docker.sock"
	dead, err := docker.New(docker.Options{Host: sock, Instance: "dead"})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	m, err := lifecycle.NewManager(f.store, dead, lifecycle.Config{WakeTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	_, err = m.Wake(ctx, rec.ID)
	if !errors.Is(err, lifecycle.ErrUnavailable) {
		t.Fatalf("wake with dead daemon: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "nonexistent-"+testenv.RunID()) || !strings.Contains(err.Error(), "starting container") {
		t.Fatalf("error does not say what failed where: %v", err)
	}
	if err := m.Destroy(ctx, rec.ID, "api"); !errors.Is(err, lifecycle.ErrUnavailable) {
		t.Fatalf("destroy with dead daemon: %v", err)
	}
	got := mustState(t, f.store, rec.ID, lifecycle.Stopped)
	if got.Error != "" {
		t.Fatalf("error recorded for a transient failure: %q", got.Error)
	}
	after, _ := f.store.EventsAfter(0, 0)
	if len(after) != len(before) {
		t.Fatalf("dead daemon wrote %d events", len(after)-len(before))
	}
}

// TestMissingImageIsClearError: an image the engine lacks is pulled only
// from a registry allowed_registries names: by default none (the message
// names the registry), from an allowed one the pull is tried (a registry
// on a closed loopback port: the pull fails, said plainly); with pull
// always, even an image on the engine is refused when its registry is not
// allowed. Each leaves nothing behind.
func TestMissingImageIsClearError(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opt     func(*docker.Options)
		image   string // "" : the test app's (on the engine)
		wantErr string
	}{
		{"no registry allowed", nil, "sandwake-no-such-image-" + testenv.RunID() + ":none",
			"its registry docker.io is not one sandwake may pull from (allowed_registries: none"},
		{"allowed registry, pull fails", func(o *docker.Options) { o.AllowedRegistries = []string{"127.0.0.1:1"} },
			"127.0.0.1:1/sandwake-no-such-image-" + testenv.RunID() + ":none", "pulling it failed"},
		{"pull always from a registry not allowed", func(o *docker.Options) { o.Pull = docker.PullAlways }, "",
			"must be pulled (pull always), but its registry docker.io is not one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			missingImage(t, newFixtureWith(t, lifecycle.Config{WakeTimeout: 30 * time.Second}, tc.opt), tc.image, tc.wantErr)
		})
	}
}

func missingImage(t *testing.T, f *fixture, image, wantErr string) {
	if image == "" {
		image = f.image
	}
	id := testenv.UniqueID("t")
	_, err := f.m.Create(context.Background(), lifecycle.CreateRequest{ID: id, Spec: lifecycle.Spec{Image: image, Ports: []int{8080}}})
	if !errors.Is(err, lifecycle.ErrImageNotFound) || !strings.Contains(err.Error(), wantErr) {
		t.Fatalf("err = %v, want ErrImageNotFound saying %q", err, wantErr)
	}
	// Nothing is left of a sandbox that could never run: no record, no
	// volume, no container, and the id stays free.
	if _, err := f.store.Get(id); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("record left after a create with a missing image: %v", err)
	}
	if _, err := f.cli.VolumeInspect(context.Background(), docker.VolumeName(id), client.VolumeInspectOptions{}); err == nil {
		f.cli.VolumeRemove(context.Background(), docker.VolumeName(id), client.VolumeRemoveOptions{Force: true})
		t.Fatal("volume left after a create with a missing image")
	}
	if _, err := f.cli.ContainerInspect(context.Background(), docker.ContainerName(id), client.ContainerInspectOptions{}); err == nil {
		t.Fatal("container left after a create with a missing image")
	}
}
