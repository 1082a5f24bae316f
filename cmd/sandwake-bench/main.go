package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/volume"
	"github.com/moby/moby/client"

	// Caddy's standard modules and sandwake, for the in-process part of the
	// scale scenario.
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/sandwake/sandwake/caddymodule"

	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// options are the command's flags.
type options struct {
	caddy          string
	quick          bool
	skipContainers bool
	only           string
	perSide        time.Duration
	wakes          int
	stormN         int   // requests per storm of the cluster scenario
	stormSizes     []int // requests per storm of the wake storm scenario
	stormList      string
	stormRounds    int
	records        int
	containers     int
	burst          int
	profile        string
	markdown       string
	soak           soakConfig
	kube           kubeOptions
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("sandwake-bench", flag.ContinueOnError)
	fs.StringVar(&o.caddy, "caddy", "bin/caddy", "the built Caddy with sandwake (`make build`); built from ./cmd/caddy when missing")
	fs.BoolVar(&o.quick, "quick", false, "a run of about 2-3 minutes: shorter cells, fewer wakes, one storm, 20 containers")
	fs.BoolVar(&o.skipContainers, "skip-containers", false, "skip the real-containers part of the scale scenario")
	fs.StringVar(&o.only, "only", "", "comma-separated scenarios to run: hotpath, wake, storm, create, containers, egress, records, cluster, soak, kubernetes (default: all but soak, and kubernetes only with a cluster: --kubeconfig)")
	fs.DurationVar(&o.perSide, "duration", 0, "hot path: measured time per side per cell (default 3s, 1s with --quick)")
	fs.IntVar(&o.wakes, "wakes", 0, "wake latency: wakes of each kind and side (default 20, 6 with --quick)")
	fs.StringVar(&o.stormList, "storm", "", "wake storm: concurrent requests, a comma-separated list of storm sizes (default 100,1000,5000; 1000 with --quick); the cluster storm takes the largest up to 1000 (the smallest when all are larger)")
	fs.IntVar(&o.stormRounds, "storm-rounds", 0, "wake storm and cluster storm: rounds (default 3, 1 with --quick)")
	fs.IntVar(&o.records, "records", 10000, "scale: records in the store")
	fs.IntVar(&o.containers, "containers", 0, "scale: real containers (default 100, 20 with --quick)")
	fs.IntVar(&o.burst, "burst", 0, "scale: containers woken at once (default 20, 5 with --quick)")
	fs.StringVar(&o.profile, "profile", "", "after the hot path, write a 10 s CPU profile of Caddy under sandwake load to this file and print its top")
	fs.StringVar(&o.markdown, "markdown", "", "also write the tables as Markdown to this file")
	fs.DurationVar(&o.soak.duration, "soak-duration", 8*time.Minute, "soak: how long the clients run")
	fs.IntVar(&o.soak.clients, "soak-clients", 12, "soak: concurrent clients")
	fs.IntVar(&o.soak.sandboxes, "soak-sandboxes", 16, "soak: sandboxes the clients pick from at random")
	fs.IntVar(&o.soak.maxResident, "soak-max-resident", 8, "soak: max_resident")
	fs.DurationVar(&o.soak.idlePause, "soak-idle-pause", 2*time.Second, "soak: idle_pause")
	fs.DurationVar(&o.soak.idleStop, "soak-idle-stop", 6*time.Second, "soak: idle_stop")
	fs.DurationVar(&o.soak.reap, "soak-reap", 500*time.Millisecond, "soak: reap_interval")
	fs.DurationVar(&o.soak.reconcile, "soak-reconcile", 5*time.Second, "soak: reconcile_interval")
	fs.IntVar(&o.soak.memoryMB, "soak-memory-mb", 32, "soak: memory_mb of each sandbox")
	fs.IntVar(&o.soak.maxBody, "soak-max-body", 4096, "soak: largest random body, bytes")
	fs.DurationVar(&o.soak.maxSleep, "soak-max-sleep", 3*time.Second, "soak: longest random pause between a client's requests")
	fs.DurationVar(&o.soak.sample, "soak-sample", 15*time.Second, "soak: how often Caddy's RSS and goroutines are sampled")
	fs.StringVar(&o.soak.extra, "soak-options", "", "soak: more lines for the sandwake global option (e.g. \"min_resident 30s\")")
	fs.StringVar(&o.kube.kubeconfig, "kubeconfig", os.Getenv("SANDWAKE_KUBECONFIG"), "kubernetes: the cluster's admin kubeconfig (default $SANDWAKE_KUBECONFIG); the scenario also reads SANDWAKE_K8S_CONTAINERD_SOCK, SANDWAKE_K8S_BRIDGE and SANDWAKE_K8S_STORAGECLASS (scripts/kubernetes/up.sh's env file)")
	fs.IntVar(&o.kube.pods, "kube-pods", 10000, "kubernetes: pods (each with its claim) the informer memory cell creates")
	fs.IntVar(&o.kube.rate, "kube-rate", 150, "kubernetes: objects the informer memory cell creates per second, at most")
	fs.StringVar(&o.kube.cells, "kube-cells", strings.Join(kubeCells, ","), "kubernetes: the cells to run, comma-separated")
	fs.IntVar(&o.kube.resizeRounds, "kube-resize-rounds", 0, "kubernetes: rounds of the in-place resize (pause tier) cell (default 10, 5 with --quick)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	def := func(v *int, full, quick int) {
		if *v == 0 {
			*v = full
			if o.quick {
				*v = quick
			}
		}
	}
	if o.perSide == 0 {
		o.perSide = 3 * time.Second
		if o.quick {
			o.perSide = time.Second
		}
	}
	if o.stormList == "" {
		o.stormList = "100,1000,5000"
		if o.quick {
			o.stormList = "1000"
		}
	}
	for _, f := range strings.Split(o.stormList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 20000 {
			return o, fmt.Errorf("--storm %q: want storm sizes from 1 to 20000, separated by commas", o.stormList)
		}
		o.stormSizes = append(o.stormSizes, n)
		if n <= 1000 && n > o.stormN {
			o.stormN = n
		}
	}
	if o.stormN == 0 {
		o.stormN = slices.Min(o.stormSizes)
	}
	def(&o.wakes, 20, 6)
	def(&o.stormRounds, 3, 1)
	def(&o.containers, 100, 20)
	def(&o.burst, 20, 5)
	def(&o.kube.resizeRounds, 10, 5)
	if o.kube.pods < 1 || o.kube.rate < 1 {
		return o, errors.New("--kube-pods and --kube-rate must be at least 1")
	}
	for _, c := range strings.Split(o.kube.cells, ",") {
		if c = strings.TrimSpace(c); c != "" && !slices.Contains(kubeCells, c) {
			return o, fmt.Errorf("--kube-cells: unknown cell %q (%s)", c, strings.Join(kubeCells, ", "))
		}
	}
	if o.soak.clients < 1 || o.soak.sandboxes < 1 || o.soak.duration <= 0 || o.soak.duration > 2*time.Hour || o.soak.maxBody < 0 || o.soak.sample <= 0 {
		return o, errors.New("--soak-*: want clients and sandboxes >= 1, a duration up to 2h, a body size >= 0 and a sample interval > 0")
	}
	if o.burst > o.containers {
		return o, errors.New("--burst must not exceed --containers")
	}
	for _, s := range strings.Split(o.only, ",") {
		if s = strings.TrimSpace(s); s != "" && !validScenario(s) {
			return o, fmt.Errorf("--only: unknown scenario %q", s)
		}
	}
	return o, nil
}

var scenarios = []string{"hotpath", "wake", "storm", "create", "containers", "egress", "records", "cluster", "soak", "kubernetes"}

func validScenario(s string) bool {
	for _, v := range scenarios {
		if v == s {
			return true
		}
	}
	return false
}

func (o *options) runs(s string) bool {
	if s == "containers" && o.skipContainers {
		return false
	}
	if o.only == "" {
		// The soak runs only when asked for: it takes minutes; the
		// kubernetes scenario when asked for or a cluster is configured.
		return s != "soak" && (s != "kubernetes" || o.kube.kubeconfig != "")
	}
	for _, v := range strings.Split(o.only, ",") {
		if strings.TrimSpace(v) == s {
			return true
		}
	}
	return false
}

var started = time.Now()

// progress prints a timestamped line while the bench runs.
func progress(format string, args ...any) {
	el := time.Since(started).Round(time.Second)
	fmt.Printf("[%02d:%02d] %s\n", int(el.Minutes()), int(el.Seconds())%60, fmt.Sprintf(format, args...))
}

func main() {
	// testing.Benchmark (scale scenario) reads the testing flags: register
	// them, with a shorter run per benchmark.
	testing.Init()
	flag.CommandLine.Set("test.benchtime", "400ms")
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "sandwake-bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C ends the bench at once
	}()
	code := 0
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "sandwake-bench:", err)
		code = 1
	}
	stop()
	os.Exit(code)
}

// bench holds what the run created, so that cleanup can remove it.
type bench struct {
	o        options
	cli      *client.Client
	tmp      string
	image    string
	gateways []*gateway
	etcd     *etcdtest.Cluster // the cluster scenario's
	kube     *kubeBench        // the kubernetes scenario's
	tables   []*table
	machine  string
}

func run(ctx context.Context, o options) (err error) {
	b := &bench{o: o}
	if o.runs("kubernetes") && o.kube.kubeconfig == "" {
		return errors.New("--only kubernetes needs a cluster: --kubeconfig, or SANDWAKE_KUBECONFIG (set -a; . /tmp/sandwake-k8s/env; set +a; export SANDWAKE_KUBECONFIG=$KUBECONFIG after scripts/kubernetes/up.sh)")
	}
	// The kubernetes scenario alone needs no Docker engine.
	api := ""
	// (Its replicas cell builds the gateway's image with Docker.)
	if slices.ContainsFunc(scenarios, func(s string) bool { return s != "kubernetes" && o.runs(s) }) || (o.runs("kubernetes") && o.kube.runs("replicas")) {
		cli, err := client.New(client.FromEnv)
		if err != nil {
			return fmt.Errorf("docker client: %w", err)
		}
		b.cli = cli
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ping, err := cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true})
		cancel()
		if err != nil {
			return fmt.Errorf("docker engine not usable: %w", err)
		}
		api = ping.APIVersion
	}
	if b.tmp, err = os.MkdirTemp("", "sandwake-bench-"); err != nil {
		return err
	}
	defer b.cleanup()

	b.machine = machine(ctx, b.cli, api)
	fmt.Printf("sandwake-bench, run %s\nmachine: %s\n", testenv.RunID(), b.machine)
	if o.caddy, err = ensureCaddy(ctx, o.caddy); err != nil {
		return err
	}
	if o.runs("hotpath") || o.runs("wake") || o.runs("storm") || o.runs("containers") {
		if err := b.mainScenarios(ctx); err != nil {
			return err
		}
	}
	if o.runs("create") {
		if err := b.ensureImage(ctx); err != nil {
			return err
		}
		n := max(o.wakes/2, 4)
		progress("create: pool hits, cold creates and raw docker create + start")
		t, err := createLatency(ctx, b, n)
		if err != nil {
			return err
		}
		b.show(t)
		if err := removeRunContainers(ctx, b.cli); err != nil {
			return err
		}
		progress("services: a group beside a single container (claim, cold create, wake)")
		if t, err = groupLatency(ctx, b, n); err != nil {
			return err
		}
		b.show(t)
		if err := removeRunContainers(ctx, b.cli); err != nil {
			return err
		}
	}
	if o.runs("egress") {
		if err := b.ensureImage(ctx); err != nil {
			return err
		}
		n := 10
		if o.quick {
			n = 4
		}
		progress("egress: firewall on vs off")
		t, err := egressCost(ctx, b, n)
		if err != nil {
			return err
		}
		b.show(t)
		if err := removeRunContainers(ctx, b.cli); err != nil {
			return err
		}
		progress("egress: rules by name vs by address")
		if t, err = egressNames(ctx, b, n); err != nil {
			return err
		}
		b.show(t)
		if err := removeRunContainers(ctx, b.cli); err != nil {
			return err
		}
	}
	if o.runs("cluster") {
		if err := b.runCluster(ctx); err != nil {
			return err
		}
	}
	if o.runs("soak") {
		if err := b.ensureImage(ctx); err != nil {
			return err
		}
		t, err := b.soak(ctx, o.soak)
		if err != nil {
			return err
		}
		b.show(t)
	}
	if o.runs("kubernetes") {
		if err := b.runKubernetes(ctx); err != nil {
			return err
		}
	}
	if o.runs("records") {
		progress("scale: records")
		t, err := scaleRecords(ctx, o.caddy, b.tmp, 1000, o.records)
		if err != nil {
			return err
		}
		b.show(t)
	}
	b.summary()
	if o.markdown != "" {
		if err := b.writeMarkdown(o.markdown); err != nil {
			return err
		}
	}
	return nil
}

// mainScenarios runs the scenarios that share one gateway and one sandbox:
// hot path, wake latency, wake storm and the real containers.
func (b *bench) mainScenarios(ctx context.Context) error {
	if err := b.ensureImage(ctx); err != nil {
		return err
	}

	g, err := b.startGateway(ctx, "gateway", "", true)
	if err != nil {
		return err
	}
	id := "h" + testenv.RunID()
	// 1 GiB: 128 concurrent 1 MiB echoes must fit.
	if err := g.createSandbox(ctx, id, b.image, 1024); err != nil {
		return err
	}
	progress("gateway up, sandbox %s running", id)

	if b.o.runs("hotpath") {
		addr, err := g.address(ctx, id)
		if err != nil {
			return err
		}
		twin, err := newPublishedTwin(ctx, b.cli, id)
		if err != nil {
			return err
		}
		// The baseline site proxies to the same container at its own
		// address (the floor), the second to a twin's published port (the
		// old path, through Docker's userland proxy), in the same Caddy (a
		// config reload keeps the engine).
		g.baseTo, g.twinTo = addr, twin.addr
		if err := g.reload(ctx); err != nil {
			return err
		}
		cfg := hotPathConfig{perSide: b.o.perSide, warmup: 500 * time.Millisecond, rounds: 3, concs: []int{1, 16, 128}}
		if b.o.quick {
			cfg.warmup, cfg.rounds = 250*time.Millisecond, 2
		}
		t, err := hotPath(ctx, g, id, cfg)
		if t != nil && len(t.rows) > 0 {
			b.show(t)
		}
		if err != nil {
			return err
		}
		if b.o.profile != "" {
			if err := profileHotPath(ctx, g, id, b.o.profile, 10*time.Second); err != nil {
				return err
			}
		}
	}
	var rawStart time.Duration
	if b.o.runs("wake") {
		t, w, err := wakeLatency(ctx, g, b.cli, id, b.o.wakes)
		if err != nil {
			return err
		}
		b.show(t)
		rawStart = percentile(sortedCopy(w.rawStopped), 50)
	}
	if b.o.runs("storm") {
		for _, n := range b.o.stormSizes {
			t, err := wakeStorm(ctx, g, b.cli, id, n, b.o.stormRounds, rawStart)
			if t != nil && len(t.rows) > 0 {
				b.show(t)
			}
			if err != nil {
				return err
			}
		}
	}
	if b.o.runs("containers") {
		t, err := fleet(ctx, g, b.cli, b.image, b.o.containers, b.o.burst, rawStart)
		if err != nil {
			return err
		}
		b.show(t)
	}
	g.stop()
	// What follows runs on a quiet engine.
	return removeRunContainers(ctx, b.cli)
}

// runCluster runs the cluster scenario, or says why not when etcd is missing
// and the scenario was not asked for by name.
func (b *bench) runCluster(ctx context.Context) error {
	if _, err := os.Stat(etcdtest.Binary); err != nil && b.o.only == "" {
		progress("cluster: skipped, %s is not installed (make tools installs etcd-server)", etcdtest.Binary)
		return nil
	}
	cfg := clusterConfig{
		hot:         hotPathConfig{perSide: b.o.perSide, warmup: 500 * time.Millisecond, rounds: 3, concs: []int{1, 16, 128}},
		stormN:      b.o.stormN,
		stormRounds: b.o.stormRounds,
	}
	if b.o.quick {
		cfg.hot.warmup, cfg.hot.rounds = 250*time.Millisecond, 2
	}
	return b.clusterScenario(ctx, cfg)
}

// ensureImage builds and imports the testapp image once per run.
func (b *bench) ensureImage(ctx context.Context) error {
	if b.image != "" {
		return nil
	}
	progress("building and importing the testapp image")
	bin, err := testenv.BuildTestApp(ctx, b.tmp)
	if err != nil {
		return err
	}
	ref := "sandwake-bench-testapp:" + testenv.RunID()
	if err := testenv.ImportImage(ctx, b.cli, bin, ref, testenv.Labels()); err != nil {
		return err
	}
	b.image = ref
	return nil
}

// removeRunContainers removes, a few at a time, the containers and volumes
// labelled with this run, then its sandbox network.
func removeRunContainers(ctx context.Context, cli *client.Client) error {
	f := client.Filters{}.Add("label", testenv.LabelRun+"="+testenv.RunID())
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return err
	}
	if err := parallel(cs.Items, 4, func(c container.Summary) error {
		_, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
		return err
	}); err != nil {
		return err
	}
	vs, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return err
	}
	if err := parallel(vs.Items, 4, func(v volume.Volume) error {
		_, err := cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true})
		return err
	}); err != nil {
		return err
	}
	ns, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: f})
	if err != nil {
		return err
	}
	for _, n := range ns.Items {
		testenv.RemoveFirewall(n.Options)
		if _, err := cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) show(t *table) {
	t.render(os.Stdout)
	b.tables = append(b.tables, t)
}

// cleanup stops the gateways and removes everything the run labelled on the
// engine, the image and the temporary directory, whatever happened before.
func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, g := range b.gateways {
		g.stop()
	}
	if b.etcd != nil {
		b.etcd.Close()
	}
	if b.kube != nil {
		b.kube.cleanup()
	}
	if b.cli == nil {
		os.RemoveAll(b.tmp)
		progress("cleaned up")
		return
	}
	if err := removeRunContainers(ctx, b.cli); err != nil {
		fmt.Fprintln(os.Stderr, "sandwake-bench: cleanup:", err)
	}
	if err := testenv.Cleanup(ctx, b.cli); err != nil { // what the first pass missed
		fmt.Fprintln(os.Stderr, "sandwake-bench: cleanup:", err)
	}
	if b.image != "" {
		if _, err := b.cli.ImageRemove(ctx, b.image, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil && !strings.Contains(err.Error(), "No such image") {
			fmt.Fprintln(os.Stderr, "sandwake-bench: removing image:", err)
		}
	}
	os.RemoveAll(b.tmp)
	b.cli.Close()
	progress("cleaned up: containers, volumes and image of run %s removed", testenv.RunID())
}

// ensureCaddy returns the path of the built Caddy, building it from
// ./cmd/caddy when missing.
func ensureCaddy(ctx context.Context, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(abs); err == nil {
		return abs, nil
	}
	progress("building %s", path)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", abs, "./cmd/caddy")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building caddy (run from the repository root, or pass --caddy): %v\n%s", err, out)
	}
	return abs, nil
}

// machine describes this machine for the report.
func machine(ctx context.Context, cli *client.Client, api string) string {
	mem := "?"
	if total, err := lifecycle.HostMemTotal(); err == nil {
		mem = fmt.Sprintf("%.0f GiB", float64(total)/(1<<30))
	}
	if cli == nil {
		return fmt.Sprintf("%d cores, %s, %s %s/%s", runtime.NumCPU(), mem, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	engine := "Docker ?"
	if v, err := cli.ServerVersion(ctx, client.ServerVersionOptions{}); err == nil {
		engine = fmt.Sprintf("Docker Engine %s (API %s)", v.Version, api)
	}
	return fmt.Sprintf("%d cores, %s, %s, %s %s/%s", runtime.NumCPU(), mem, engine, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// summary prints the ratios the goals are about and the misses.
func (b *bench) summary() {
	fmt.Printf("\n== Summary (ratio = sandwake / baseline)\n")
	for _, s := range []struct {
		what, title, suffix string
		worstHigh           bool
		g                   string
	}{
		{"hot path throughput, worst cell", hotPathTitle, " throughput", false, "≥ 0.95"},
		{"hot path p99 latency, worst cell", hotPathTitle, " p99", true, "≤ 1.10"},
		{"wake from paused (mean)", "", "from paused, mean", true, "≤ 1.10"},
		{"wake from stopped (mean)", "", "from stopped, mean", true, "≤ 1.10"},
		{"forwarded throughput, worst cell", clusterForwardTitle, " throughput", false, ""},
		{"forwarded p99 latency, worst cell", clusterForwardTitle, " p99", true, ""},
		{"forwarded Caddy CPU/req, worst", clusterForwardTitle, " Caddy CPU/request", true, "≤ 2.1"},
		{"spread storm p99", clusterStormTitle, "p99 time to answer", true, "≤ 1.3"},
		{"spread storm last answer", clusterStormTitle, "time to last answer", true, "≤ 1.2"},
	} {
		if r, ok := b.worst(s.title, s.suffix, s.worstHigh); ok {
			if s.g == "" {
				fmt.Printf("%-34s %5.2f  (no goal: forwarded / direct; %s)\n", s.what+":", r.ratio, r.cell)
				continue
			}
			fmt.Printf("%-34s %5.2f  (goal %s, %s; %s)\n", s.what+":", r.ratio, s.g, r.verdict, r.cell)
		}
	}
	// The kubernetes scenario's cells, each against its goal (or why it
	// has none: n/a).
	for _, t := range b.tables {
		if !strings.HasPrefix(t.title, kubeTitlePrefix) {
			continue
		}
		cell, _, _ := strings.Cut(strings.TrimPrefix(t.title, kubeTitlePrefix), ":")
		for _, r := range t.rows {
			if r.goal == "" && !strings.HasPrefix(r.sandwake, "n/a") {
				continue
			}
			v := r.sandwake
			if !math.IsNaN(r.ratio) {
				v = fmt.Sprintf("%.2f", r.ratio)
			}
			if r.goal == "" {
				fmt.Printf("k8s %s: %s\n", cell, v)
				continue
			}
			fmt.Printf("k8s %s, %s: %s  (goal %s, %s)\n", cell, r.cell, v, r.goal, r.verdict)
		}
	}
	misses := 0
	for _, t := range b.tables {
		misses += t.misses()
	}
	fmt.Printf("goals missed: %d\n", misses)
	progress("total elapsed %s", time.Since(started).Round(time.Second))
}

// worst finds, among the rows whose cell ends with suffix in the tables
// whose title begins with title (any table but the kubernetes scenario's
// for ""), the one with the highest (worstHigh) or
// lowest ratio.
func (b *bench) worst(title, suffix string, worstHigh bool) (row, bool) {
	var w row
	found := false
	for _, t := range b.tables {
		if (title != "" && !strings.HasPrefix(t.title, title)) || (title == "" && strings.HasPrefix(t.title, kubeTitlePrefix)) {
			continue
		}
		for _, r := range t.rows {
			if !strings.HasSuffix(r.cell, suffix) || math.IsNaN(r.ratio) {
				continue
			}
			if !found || (worstHigh && r.ratio > w.ratio) || (!worstHigh && r.ratio < w.ratio) {
				w, found = r, true
			}
		}
	}
	return w, found
}

func (b *bench) writeMarkdown(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "Machine: %s. Command: `sandwake-bench %s`.\n", b.machine, strings.Join(os.Args[1:], " "))
	for _, t := range b.tables {
		t.markdown(f)
	}
	return f.Close()
}
