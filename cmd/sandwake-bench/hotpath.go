package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// loadResult is what one side of a cell measured.
type loadResult struct {
	durs    []time.Duration // one per answered request
	ok      int             // answers that were 200 with the expected body length
	bad     int             // transport errors, other statuses, short bodies
	elapsed time.Duration
	cpu     time.Duration // Caddy's CPU time meanwhile
	err     error         // the first failure, for the report
}

func (r *loadResult) merge(o loadResult) {
	r.durs = append(r.durs, o.durs...)
	r.ok += o.ok
	r.bad += o.bad
	r.elapsed += o.elapsed
	r.cpu += o.cpu
	if r.err == nil {
		r.err = o.err
	}
}

// cpuPerRequest is Caddy's CPU time per answered request, in nanoseconds.
func (r *loadResult) cpuPerRequest() float64 {
	if r.ok == 0 {
		return 0
	}
	return float64(r.cpu.Nanoseconds()) / float64(r.ok)
}

func (r *loadResult) throughput() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ok) / r.elapsed.Seconds()
}

// request is one kind of request of the hot path.
type request struct {
	name    string
	method  string
	path    string
	body    []byte
	wantLen int64 // expected response body length
}

// load runs conc workers sending req to url for d, each request after the
// previous one's answer was read, and records each request's duration.
// Requests started before the deadline count; elapsed runs until the last
// one ends.
func load(ctx context.Context, c *http.Client, url string, req request, conc int, d time.Duration) loadResult {
	var (
		mu  sync.Mutex
		res loadResult
		wg  sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine loadResult
			mine.durs = make([]time.Duration, 0, 4096)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				var body io.Reader
				if req.body != nil {
					body = bytes.NewReader(req.body)
				}
				hr, err := http.NewRequestWithContext(ctx, req.method, url+req.path, body)
				if err != nil {
					mine.bad++
					mine.err = err
					break
				}
				t0 := time.Now()
				resp, err := c.Do(hr)
				if err != nil {
					mine.bad++
					if mine.err == nil {
						mine.err = err
					}
					continue
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mine.durs = append(mine.durs, time.Since(t0))
				if err != nil || resp.StatusCode != 200 || n != req.wantLen {
					mine.bad++
					if mine.err == nil {
						mine.err = fmt.Errorf("%s: %d, %d bytes (want %d), %v", req.name, resp.StatusCode, n, req.wantLen, err)
					}
					continue
				}
				mine.ok++
			}
			mu.Lock()
			res.merge(mine)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// hotPathConfig sets the hot-path scenario's durations.
type hotPathConfig struct {
	perSide time.Duration // measured time of each side in each cell
	warmup  time.Duration // per side, before each cell
	rounds  int           // the measured time is split in this many alternated slices
	concs   []int
	// title and what name the table and its baseline ("": the Docker
	// hot path's, hotPathTitle and the container's address).
	title, what string
}

const hotPathTitle = "Hot path: plain reverse_proxy to the container's address (baseline) vs sandwake_preview"

// hotPath compares, on the same Caddy, a plain reverse_proxy to the
// sandbox's container at its own address (the floor: what sandwake dials in
// upstream mode direct) with sandwake_preview, for a small GET and a 1 MiB
// POST at each concurrency; a third side, a plain reverse_proxy to a twin
// container's port published through Docker's userland proxy, is the path
// every request took before upstream mode direct. The sides alternate in
// slices (A B C, C B A, …) so that they share the machine's noise.
func hotPath(ctx context.Context, g *gateway, id string, cfg hotPathConfig) (*table, error) {
	payload := bytes.Repeat([]byte("sandwake"), (1<<20)/8) // 1 MiB
	reqs := []request{
		{name: "GET /healthz (3 B)", method: "GET", path: "/healthz", wantLen: 3},
		{name: "POST /echo 1 MiB", method: "POST", path: "/echo", body: payload, wantLen: int64(len(payload)) + 5}, // "POST\n" + body
	}
	maxConc := 0
	for _, c := range cfg.concs {
		maxConc = max(maxConc, c)
	}
	// One client per side, so that each keeps its own warm connections.
	type side struct {
		name string
		c    *http.Client
		url  string
	}
	sides := []side{
		{"baseline (address)", loopbackClient(maxConc), g.baseURL("")},
		{"sandwake", loopbackClient(maxConc), g.previewURL(id, "")},
	}
	if g.twinTo != "" {
		sides = append(sides, side{"published twin", loopbackClient(maxConc), g.twinURL("")})
	}

	t := &table{
		title: cmp.Or(cfg.title, hotPathTitle),
		note: fmt.Sprintf("same Caddy; %s; %s per side per cell after %s warm-up, alternated in %d slices; ratio = sandwake / baseline (twin rows: sandwake / published twin)",
			cmp.Or(cfg.what, "baseline and sandwake reach the same container at its address, the twin row a twin container's port published on 127.0.0.1"), cfg.perSide, cfg.warmup, cfg.rounds),
	}
	slice := cfg.perSide / time.Duration(cfg.rounds)
	// measured runs one slice, noting the CPU time Caddy used meanwhile: a
	// figure the other load on the machine moves much less than throughput.
	measured := func(c *http.Client, url string, req request, conc int) loadResult {
		c0, _ := g.cpuTime()
		r := load(ctx, c, url, req, conc, slice)
		c1, _ := g.cpuTime()
		r.cpu = c1 - c0
		return r
	}
	for _, req := range reqs {
		for _, conc := range cfg.concs {
			for _, sd := range sides {
				load(ctx, sd.c, sd.url, req, conc, cfg.warmup)
			}
			res := make([]loadResult, len(sides))
			for r := range cfg.rounds {
				for k := range sides {
					i := k
					if r%2 == 1 {
						i = len(sides) - 1 - k
					}
					res[i].merge(measured(sides[i].c, sides[i].url, req, conc))
				}
			}
			if ctx.Err() != nil {
				return t, ctx.Err()
			}
			for i, sd := range sides {
				if res[i].bad > 0 || res[i].ok == 0 {
					return t, fmt.Errorf("%s, c=%d, %s: %d failed of %d: %v", req.name, conc, sd.name, res[i].bad, res[i].bad+res[i].ok, res[i].err)
				}
			}
			base, sw := &res[0], &res[1]
			bs, ss := sortedCopy(base.durs), sortedCopy(sw.durs)
			cell := fmt.Sprintf("%s c=%d", req.name, conc)
			t.add(ratioRow(cell+" throughput", base.throughput(), sw.throughput(), fmtRate, atLeast(0.95)))
			t.add(ratioRow(cell+" p50", percentile(bs, 50).Seconds(), percentile(ss, 50).Seconds(), fmtSeconds, info))
			t.add(ratioRow(cell+" p99", percentile(bs, 99).Seconds(), percentile(ss, 99).Seconds(), fmtSeconds, atMost(1.10)))
			t.add(ratioRow(cell+" Caddy CPU/request", base.cpuPerRequest(), sw.cpuPerRequest(), fmtNanos, info))
			if len(res) > 2 {
				tw := &res[2]
				goal := info
				if conc == 16 {
					goal = atLeast(1.2)
				}
				t.add(ratioRow(cell+" throughput vs published twin", tw.throughput(), sw.throughput(), fmtRate, goal))
				t.add(ratioRow(cell+" p99 vs published twin", percentile(sortedCopy(tw.durs), 99).Seconds(), percentile(ss, 99).Seconds(), fmtSeconds, info))
				progress("hot path: %s: %.0f (address) vs %.0f (sandwake) vs %.0f (published) req/s", cell, base.throughput(), sw.throughput(), tw.throughput())
			} else {
				progress("hot path: %s: %.0f vs %.0f req/s", cell, base.throughput(), sw.throughput())
			}
		}
	}
	return t, nil
}

// profileHotPath takes CPU profiles of Caddy through its admin endpoint
// while it loads one side with a small GET for d: sandwake at concurrency 16
// (path), then sandwake and the baseline (the plain reverse_proxy to the
// same address) at concurrency 1 (path.c1, path.c1-baseline), the cell the
// goals miss. It prints the top of the first and the difference of the two
// c=1 profiles per request: where sandwake's extra CPU goes.
func profileHotPath(ctx context.Context, g *gateway, id, path string, d time.Duration) error {
	req := request{name: "GET /healthz", method: "GET", path: "/healthz", wantLen: 3}
	profile := func(url, file string, conc int) (loadResult, error) {
		done := startProfile(ctx, g, file, d)
		r := load(ctx, loopbackClient(conc), url, req, conc, d+time.Second)
		return r, <-done
	}
	if _, err := profile(g.previewURL(id, ""), path, 16); err != nil {
		return err
	}
	abs, _ := filepath.Abs(path)
	fmt.Printf("\nCPU profile of Caddy under sandwake load (GET, c=16, %s): %s\n", d, abs)
	if err := printProfile(ctx, g, path, "sandwake/"); err != nil {
		return err
	}
	sw, err := profile(g.previewURL(id, ""), path+".c1", 1)
	if err != nil {
		return err
	}
	base, err := profile(g.baseURL(""), path+".c1-baseline", 1)
	if err != nil {
		return err
	}
	fmt.Printf("\nCPU profiles at c=1 (GET, %s each): sandwake %d requests (%s), baseline %d requests (%s)\n",
		d, len(sw.durs), path+".c1", len(base.durs), path+".c1-baseline")
	return printProfileDiff(ctx, g, path+".c1", len(sw.durs), path+".c1-baseline", len(base.durs))
}

// printProfileDiff prints where a profile of n requests spends more CPU per
// request than a base profile of nBase requests: each function's flat CPU
// divided by its side's request count, the 20 largest differences.
func printProfileDiff(ctx context.Context, g *gateway, path string, n int, basePath string, nBase int) error {
	if n == 0 || nBase == 0 {
		return errors.New("profile: a side answered no request")
	}
	flat := func(file string) (map[string]time.Duration, time.Duration, error) {
		out, err := pprofTop(ctx, g, file, "-nodecount=100000")
		if err != nil {
			return nil, 0, err
		}
		fns := map[string]time.Duration{}
		var total time.Duration
		for _, l := range strings.Split(string(out), "\n") {
			// "     flat  flat%   sum%        cum   cum%  name"
			f := strings.Fields(l)
			if len(f) < 6 || !strings.HasSuffix(f[1], "%") {
				continue
			}
			d, err := time.ParseDuration(f[0])
			if err != nil {
				continue
			}
			fns[strings.Join(f[5:], " ")] += d
			total += d
		}
		return fns, total, nil
	}
	a, ta, err := flat(path)
	if err != nil {
		return err
	}
	b, tb, err := flat(basePath)
	if err != nil {
		return err
	}
	per := func(d time.Duration, count int) time.Duration { return d / time.Duration(count) }
	fmt.Printf("Caddy CPU per request at c=1: sandwake %s, baseline %s (%.2f)\n", per(ta, n), per(tb, nBase), float64(per(ta, n))/float64(per(tb, nBase)))
	type row struct {
		name string
		diff time.Duration
	}
	var rows []row
	for name := range a {
		rows = append(rows, row{name, per(a[name], n) - per(b[name], nBase)})
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			rows = append(rows, row{name, -per(b[name], nBase)})
		}
	}
	slices.SortFunc(rows, func(x, y row) int { return cmp.Compare(y.diff, x.diff) })
	fmt.Println("more CPU per request than the baseline (flat, by function):")
	for _, r := range rows[:min(20, len(rows))] {
		fmt.Printf("  %+8.2fµs  %s\n", float64(r.diff)/float64(time.Microsecond), r.name)
	}
	return nil
}

// startProfile takes a CPU profile of g's Caddy for d through its admin
// endpoint, into path; the channel tells when it is written.
func startProfile(ctx context.Context, g *gateway, path string, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		url := g.adminURL(fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds())))
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			done <- errors.New("profile: " + resp.Status)
			return
		}
		f, err := os.Create(path)
		if err != nil {
			done <- err
			return
		}
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	return done
}

// pprofTop is `go tool pprof -top` of a CPU profile of g's Caddy, with
// more flags.
func pprofTop(ctx context.Context, g *gateway, file string, flags ...string) ([]byte, error) {
	args := append([]string{"tool", "pprof", "-top"}, flags...)
	out, err := exec.CommandContext(ctx, "go", append(args, g.bin, file)...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof: %v\n%s", err, out)
	}
	return out, nil
}

// printProfile prints the top of a CPU profile of g's Caddy, then the
// cumulative share of the frames under focus (a package path).
func printProfile(ctx context.Context, g *gateway, path, focus string) error {
	out, err := pprofTop(ctx, g, path, "-nodecount=25")
	if err != nil {
		return err
	}
	fmt.Println(strings.TrimSpace(string(out)))
	// sandwake's share: the gate's cumulative time minus what it hands on
	// to reverse_proxy.
	out, err = pprofTop(ctx, g, path, "-cum", "-nodecount=400", "-focus="+focus)
	if err != nil {
		return err
	}
	fmt.Println("sandwake's frames (cumulative):")
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "Total samples") || strings.Contains(l, "sandwake/sandwake/") || strings.Contains(l, "reverseproxy.(*Handler).ServeHTTP") {
			fmt.Println(strings.TrimSpace(l))
		}
	}
	return nil
}
