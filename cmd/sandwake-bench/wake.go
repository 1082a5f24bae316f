package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// firstByte sends GET url and returns the time until the first byte of the
// answer arrived; the answer must be a 200.
func firstByte(ctx context.Context, c *http.Client, url string) (time.Duration, error) {
	var first time.Time
	trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), "GET", url, nil)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return first.Sub(t0), nil
}

// rawContainer is a twin of a sandbox's container (same image, command,
// limits and volume) that sandwake does not manage: the baseline of the wake
// scenario, woken by raw Docker calls, and of the hot path through a
// published port. It runs on a bridge network of the run's own made as the
// sandbox network is (inter-container communication off): the sandbox
// network itself admits only addresses sandwake bound to their sandbox.
type rawContainer struct {
	cli       *client.Client
	name      string
	published bool
	addr      string // its address (or, published, 127.0.0.1 port) of port 8080
}

// newRawTwin creates and starts the twin of sandbox id's container, dialled
// at its own address, as sandwake dials sandboxes in upstream mode direct.
func newRawTwin(ctx context.Context, cli *client.Client, id string) (*rawContainer, error) {
	return newRawTwinNamed(ctx, cli, id, "sandwake-bench-raw-"+testenv.RunID(), false)
}

// newPublishedTwin creates and starts a twin whose port 8080 is published
// on 127.0.0.1, behind Docker's userland proxy: the old upstream path.
func newPublishedTwin(ctx context.Context, cli *client.Client, id string) (*rawContainer, error) {
	return newRawTwinNamed(ctx, cli, id, "sandwake-bench-pub-"+testenv.RunID(), true)
}

// newRawTwinNamed is newRawTwin under a name of the caller's.
func newRawTwinNamed(ctx context.Context, cli *client.Client, id, name string, published bool) (*rawContainer, error) {
	ci, err := cli.ContainerInspect(ctx, docker.ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		return nil, err
	}
	cfg := *ci.Container.Config
	cfg.Labels = testenv.Labels() // not sandwake's: its reconcile never sees it
	cfg.ExposedPorts = maps.Clone(cfg.ExposedPorts)
	net, err := twinNetwork(ctx, cli)
	if err != nil {
		return nil, err
	}
	hc := *ci.Container.HostConfig
	hc.NetworkMode = container.NetworkMode(net)
	hc.PortBindings = nil
	if published {
		port, _ := network.PortFrom(8080, network.TCP)
		hc.PortBindings = network.PortMap{port: []network.PortBinding{{HostIP: netip.MustParseAddr("127.0.0.1")}}}
	}
	r := &rawContainer{cli: cli, name: name, published: published}
	if _, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: r.name, Config: &cfg, HostConfig: &hc}); err != nil {
		return nil, fmt.Errorf("creating the raw twin: %w", err)
	}
	if err := r.start(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// start is the raw wake from stopped: start, read the address (or the
// published port) again, as it can change on every start, then the
// readiness poll.
func (r *rawContainer) start(ctx context.Context) error {
	if _, err := r.cli.ContainerStart(ctx, r.name, client.ContainerStartOptions{}); err != nil {
		return err
	}
	ci, err := r.cli.ContainerInspect(ctx, r.name, client.ContainerInspectOptions{})
	if err != nil {
		return err
	}
	r.addr = ""
	if r.published {
		for p, bs := range ci.Container.NetworkSettings.Ports {
			if p.Num() == 8080 && len(bs) > 0 {
				r.addr = "127.0.0.1:" + bs[0].HostPort
			}
		}
	} else if ep := ci.Container.NetworkSettings.Networks[twinNetworkName()]; ep != nil && ep.IPAddress.IsValid() {
		r.addr = netip.AddrPortFrom(ep.IPAddress.Unmap(), 8080).String()
	}
	if r.addr == "" {
		return fmt.Errorf("raw twin: no address for port 8080")
	}
	return r.ready(ctx)
}

// twinNetworkName is the run's network of raw twins.
func twinNetworkName() string { return "sandwake-bench-twins-" + testenv.RunID() }

// twinNetwork makes the run's network of raw twins when it is missing: a
// bridge like the sandbox network (inter-container communication off),
// labelled with the run, so that removeRunContainers removes it.
func twinNetwork(ctx context.Context, cli *client.Client) (string, error) {
	name := twinNetworkName()
	if _, err := cli.NetworkInspect(ctx, name, client.NetworkInspectOptions{}); err == nil {
		return name, nil
	}
	if _, err := cli.NetworkCreate(ctx, name, client.NetworkCreateOptions{Driver: "bridge", Labels: testenv.Labels(),
		Options: map[string]string{"com.docker.network.bridge.enable_icc": "false"}}); err != nil {
		return "", fmt.Errorf("creating the raw twins' network: %w", err)
	}
	return name, nil
}

// ready is the first byte of an HTTP answer at the twin's address, polled
// with backoff from 5 ms (sandwake's own poll).
func (r *rawContainer) ready(ctx context.Context) error {
	spec := lifecycle.Spec{Ports: []int{8080}, ReadyMode: lifecycle.ReadyHTTP}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return lifecycle.WaitReady(ctx, r.addr, &spec)
}

func (r *rawContainer) pause(ctx context.Context) error {
	_, err := r.cli.ContainerPause(ctx, r.name, client.ContainerPauseOptions{})
	return err
}

// settle waits before a container is put to sleep again right after a wake,
// and retries the sleep a few times: Docker 20.10 applies containerd's
// paused/resumed events to its state asynchronously, so a pause right after
// an unpause can be refused ("already paused") while a late event lands.
func settle(ctx context.Context, sleep func() error) error {
	var err error
	for range 20 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if err = sleep(); err == nil {
			return nil
		}
	}
	return err
}

// unpause is the raw wake from paused: unpause, then the readiness poll.
func (r *rawContainer) unpause(ctx context.Context) error {
	if _, err := r.cli.ContainerUnpause(ctx, r.name, client.ContainerUnpauseOptions{}); err != nil {
		return err
	}
	return r.ready(ctx)
}

func (r *rawContainer) stop(ctx context.Context) error {
	secs := 2 // sandwake's stop_timeout in the bench config
	_, err := r.cli.ContainerStop(ctx, r.name, client.ContainerStopOptions{Timeout: &secs})
	return err
}

// wakeTimes are the measured wakes of each kind.
type wakeTimes struct {
	rawPaused, swPaused, rawStopped, swStopped []time.Duration
}

// wakeLatency times, alternately, a raw wake of the twin (Docker call plus
// readiness poll) and a wake through sandwake (pause or stop through the API,
// then a GET to the preview host, timed to the answer's first byte).
func wakeLatency(ctx context.Context, g *gateway, cli *client.Client, id string, iterations int) (*table, *wakeTimes, error) {
	raw, err := newRawTwin(ctx, cli, id)
	if err != nil {
		return nil, nil, err
	}
	c := loopbackClient(4)
	url := g.previewURL(id, "/healthz")
	if _, err := firstByte(ctx, c, url); err != nil { // a warm connection to Caddy
		return nil, nil, err
	}
	var w wakeTimes
	// The engine's own time per wake, from sandwake's metric.
	engineMean := map[string]time.Duration{}
	type kind struct {
		name              string
		sleepSW, sleepRaw func() error
		wakeRaw           func() error
		rawT, swT         *[]time.Duration
	}
	kinds := []kind{
		{"paused", func() error { return g.act(ctx, id, "pause", "paused") }, func() error { return raw.pause(ctx) },
			func() error { return raw.unpause(ctx) }, &w.rawPaused, &w.swPaused},
		{"stopped", func() error { return g.act(ctx, id, "stop", "stopped") }, func() error { return raw.stop(ctx) },
			func() error { return raw.start(ctx) }, &w.rawStopped, &w.swStopped},
	}
	for _, k := range kinds {
		// One untimed round of each first: caches, connections.
		var engine0 wakeMetric
		for i := -1; i < iterations; i++ {
			if i == 0 {
				engine0, _ = g.wakeMetric(ctx, k.name)
			}
			swFirst := i%2 == 0
			for side := range 2 {
				if (side == 0) == swFirst {
					if err := settle(ctx, k.sleepSW); err != nil {
						return nil, nil, err
					}
					d, err := firstByte(ctx, c, url)
					if err != nil {
						return nil, nil, fmt.Errorf("wake from %s through sandwake: %w", k.name, err)
					}
					if i >= 0 {
						*k.swT = append(*k.swT, d)
					}
				} else {
					if err := settle(ctx, k.sleepRaw); err != nil {
						return nil, nil, fmt.Errorf("raw: sleeping the twin: %w", err)
					}
					t0 := time.Now()
					if err := k.wakeRaw(); err != nil {
						return nil, nil, fmt.Errorf("raw wake from %s: %w", k.name, err)
					}
					if i >= 0 {
						*k.rawT = append(*k.rawT, time.Since(t0))
					}
				}
			}
		}
		if m, err := g.wakeMetric(ctx, k.name); err == nil && m.count > engine0.count {
			engineMean[k.name] = time.Duration((m.sum - engine0.sum) / (m.count - engine0.count) * float64(time.Second))
		}
		progress("wake from %s: raw %s, sandwake %s (means of %d)", k.name, fmtDuration(mean(*k.rawT)), fmtDuration(mean(*k.swT)), iterations)
	}

	t := &table{
		title: "Wake latency: raw Docker call + readiness poll (baseline) vs first byte through sandwake",
		note: fmt.Sprintf("%d wakes of each, alternated; raw = unpause, or start + inspect for the address, then an HTTP GET at the container's address polled from 5 ms until its first byte, on an identical container sandwake does not manage",
			iterations),
	}
	for _, k := range kinds {
		rs, ss := sortedCopy(*k.rawT), sortedCopy(*k.swT)
		t.add(ratioRow("from "+k.name+", mean", mean(rs).Seconds(), mean(ss).Seconds(), fmtSeconds, atMost(1.10)))
		t.add(ratioRow("from "+k.name+", p50", percentile(rs, 50).Seconds(), percentile(ss, 50).Seconds(), fmtSeconds, info))
		t.add(ratioRow("from "+k.name+", max", rs[len(rs)-1].Seconds(), ss[len(ss)-1].Seconds(), fmtSeconds, info))
		if d, ok := engineMean[k.name]; ok {
			t.add(ratioRow("from "+k.name+", of which the engine's wake, mean", mean(rs).Seconds(), d.Seconds(), fmtSeconds, info))
		}
	}
	t.add(valueRow("paused → first byte, mean", "", mean(w.swPaused).Seconds(), fmtSeconds, goal{op: "<=", limit: 0.050, format: fmtSeconds}))
	return t, &w, nil
}

// wakeMetric is sandwake's wake-duration histogram for one from-state: the
// engine's own time per wake (admission, Docker call, readiness poll,
// record), without the request path around it.
type wakeMetric struct{ sum, count float64 }

// wakeMetric reads caddy_sandwake_wake_duration_seconds{from=…} from Caddy's
// metrics on the admin endpoint.
func (g *gateway) wakeMetric(ctx context.Context, from string) (wakeMetric, error) {
	var m wakeMetric
	req, _ := http.NewRequestWithContext(ctx, "GET", g.adminURL("/metrics"), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return m, err
	}
	label := `{from="` + from + `"} `
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "caddy_sandwake_wake_duration_seconds_sum"+label); ok {
			m.sum, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(l, "caddy_sandwake_wake_duration_seconds_count"+label); ok {
			m.count, _ = strconv.ParseFloat(v, 64)
		}
	}
	if m.count == 0 {
		return m, fmt.Errorf("no wake metric from %s", from)
	}
	return m, nil
}
