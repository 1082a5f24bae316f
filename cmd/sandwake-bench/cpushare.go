package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle/docker"
)

// cpuShares is where the machine's CPU went over an interval: all of it
// (busy, out of wall × cores) and the processes a proxied request passes
// through. It tells whether a storm is bound by the machine rather than by
// sandwake's pacing.
type cpuShares struct {
	wall, busy                    time.Duration
	caddy, dockerProxy, app, self time.Duration
}

// add sums two intervals.
func (s *cpuShares) add(o cpuShares) {
	s.wall += o.wall
	s.busy += o.busy
	s.caddy += o.caddy
	s.dockerProxy += o.dockerProxy
	s.app += o.app
	s.self += o.self
}

// cpuProbe reads the counters cpuShares is made of.
type cpuProbe struct {
	g      *gateway
	appPid int
}

// newCPUProbe finds the process of sandbox id's app (its container's init)
// for a probe of g's Caddy.
func newCPUProbe(ctx context.Context, g *gateway, cli *client.Client, id string) (*cpuProbe, error) {
	ci, err := cli.ContainerInspect(ctx, docker.ContainerName(id), client.ContainerInspectOptions{})
	if err != nil {
		return nil, err
	}
	if ci.Container.State == nil || ci.Container.State.Pid == 0 {
		return nil, fmt.Errorf("sandbox %s has no running process", id)
	}
	return &cpuProbe{g: g, appPid: ci.Container.State.Pid}, nil
}

// snapshot is the counters now.
func (p *cpuProbe) snapshot() (s cpuShares, at time.Time) {
	at = time.Now()
	s.busy = machineBusy()
	s.caddy, _ = p.g.cpuTime()
	s.app = pidCPU(p.appPid)
	s.self = pidCPU(os.Getpid())
	// Docker's userland proxies, one per published port: all of them, the
	// others idle.
	dirs, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, d := range dirs {
		if b, err := os.ReadFile(d); err == nil && strings.TrimSpace(string(b)) == "docker-proxy" {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
			s.dockerProxy += pidCPU(pid)
		}
	}
	return s, at
}

// since is what the counters grew since snapshot a, taken at t0.
func (p *cpuProbe) since(a cpuShares, t0 time.Time) cpuShares {
	b, t1 := p.snapshot()
	return cpuShares{wall: t1.Sub(t0), busy: b.busy - a.busy, caddy: b.caddy - a.caddy,
		dockerProxy: b.dockerProxy - a.dockerProxy, app: b.app - a.app, self: b.self - a.self}
}

// pidCPU is a process's user + system time (0 when it is gone).
func pidCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	d, _ := parseStatCPU(string(b))
	return d
}

// machineBusy is the CPU time all cores spent not idle since boot, from
// /proc/stat (user, nice, system, irq, softirq, steal).
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// rows are the shares as table rows, of the machine's capacity over the
// interval (wall × cores).
func (s cpuShares) rows(label string) []row {
	capacity := s.wall.Seconds() * float64(runtime.NumCPU())
	pct := func(d time.Duration) float64 { return 100 * d.Seconds() / capacity }
	fmtPct := func(v float64) string { return fmt.Sprintf("%.0f %%", v) }
	return []row{
		valueRow(label+"machine CPU busy (all processes, of all cores)", "", pct(s.busy), fmtPct, info),
		valueRow(label+"of which Caddy", "", pct(s.caddy), fmtPct, info),
		valueRow(label+"of which Docker's userland proxies", "", pct(s.dockerProxy), fmtPct, info),
		valueRow(label+"of which the app", "", pct(s.app), fmtPct, info),
		valueRow(label+"of which the bench's clients", "", pct(s.self), fmtPct, info),
	}
}
