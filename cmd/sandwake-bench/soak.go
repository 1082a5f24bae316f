package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandwake/sandwake/internal/testenv"
)

// soakConfig is the churn scenario: clients sending POST /echo with random
// bodies to random sandboxes of a fleet larger than max_resident, with short
// idle tiers, so that idle reaping, eviction and wakes race with traffic.
type soakConfig struct {
	duration    time.Duration
	clients     int
	sandboxes   int
	maxResident int
	idlePause   time.Duration
	idleStop    time.Duration
	reap        time.Duration
	reconcile   time.Duration
	memoryMB    int
	maxBody     int
	maxSleep    time.Duration
	sample      time.Duration
	extra       string // more lines for the sandwake global option
}

// soakResult is what the clients saw and what the gateway did.
type soakResult struct {
	requests, correct, wrongBody, bare502, transport int
	byCode                                           map[string]int // non-200 answers: "503 capacity", "502 {json}", …
	durs                                             []time.Duration
	wakes, evictions, idlePauses, idleStops          int
	rss                                              []int64
	goroutines                                       []int
	elapsed                                          time.Duration
}

// soakClient is one client's loop: pick a sandbox, send a random body, check
// the echo, sleep, until the deadline.
func soakClient(ctx context.Context, c *http.Client, g *gateway, ids []string, cfg soakConfig, seed uint64, deadline time.Time, res *soakResult, mu *sync.Mutex) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for time.Now().Before(deadline) && ctx.Err() == nil {
		id := ids[rng.IntN(len(ids))]
		body := make([]byte, rng.IntN(cfg.maxBody+1))
		for i := range body {
			body[i] = 'a' + byte(rng.IntN(26))
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", g.previewURL(id, "/echo"), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/octet-stream")
		t0 := time.Now()
		resp, err := c.Do(req)
		var (
			got  []byte
			code int
		)
		if err == nil {
			got, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			code = resp.StatusCode
		}
		d := time.Since(t0)
		mu.Lock()
		res.requests++
		switch {
		case err != nil:
			if ctx.Err() == nil {
				res.transport++
				res.byCode["transport error"]++
			}
		case code == 200 && string(got) == "POST\n"+string(body):
			res.correct++
			res.durs = append(res.durs, d)
		case code == 200:
			res.wrongBody++
		case code == 502 && len(bytes.TrimSpace(got)) == 0:
			res.bare502++
		default:
			res.byCode[strconv.Itoa(code)+" "+errorCode(got)]++
		}
		mu.Unlock()
		sleep := time.Duration(rng.Int64N(int64(cfg.maxSleep) + 1))
		select {
		case <-ctx.Done():
		case <-time.After(sleep):
		}
	}
}

// errorCode is the code of a sandwake JSON error body, else a short excerpt.
func errorCode(b []byte) string {
	var e struct {
		Error struct{ Code, Message string }
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
		return e.Error.Code
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return fmt.Sprintf("%q", s)
}

// soak runs the churn scenario on its own gateway and tabulates it.
func (b *bench) soak(ctx context.Context, cfg soakConfig) (*table, error) {
	// Created with the idle tiers off and room for all; the churn settings
	// come with a reload once every sandbox exists.
	g, err := b.startGateway(ctx, "soak", fmt.Sprintf("max_resident %d", cfg.sandboxes), true)
	if err != nil {
		return nil, err
	}
	defer g.stop()
	ids := make([]string, cfg.sandboxes)
	for i := range ids {
		ids[i] = fmt.Sprintf("soak%s%02d", testenv.RunID(), i)
	}
	if err := parallel(ids, 4, func(id string) error { return g.createSandbox(ctx, id, b.image, cfg.memoryMB) }); err != nil {
		return nil, err
	}
	g.extra = fmt.Sprintf("max_resident %d\n\t\tidle_pause %s\n\t\tidle_stop %s\n\t\treap_interval %s\n\t\treconcile_interval %s\n\t\t%s",
		cfg.maxResident, cfg.idlePause, cfg.idleStop, cfg.reap, cfg.reconcile, cfg.extra)
	if err := g.reload(ctx); err != nil {
		return nil, err
	}
	progress("soak: %d sandboxes created; %d clients for %s (max_resident %d, idle_pause %s, idle_stop %s)",
		cfg.sandboxes, cfg.clients, cfg.duration, cfg.maxResident, cfg.idlePause, cfg.idleStop)

	res := &soakResult{byCode: map[string]int{}}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(cfg.duration)
	c := loopbackClient(cfg.clients)
	for i := range cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			soakClient(ctx, c, g, ids, cfg, uint64(i+1), deadline, res, &mu)
		}()
	}
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(cfg.sample)
		defer t.Stop()
		for {
			if rss, err := g.rss(); err == nil {
				res.rss = append(res.rss, rss)
			}
			if n, err := g.goroutines(ctx); err == nil {
				res.goroutines = append(res.goroutines, n)
			}
			mu.Lock()
			n, bad := res.requests, res.bare502+res.wrongBody
			mu.Unlock()
			progress("soak: %s, %d requests, %d bare 502 or wrong bodies", time.Since(start).Round(time.Second), n, bad)
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
			if time.Now().After(deadline) {
				return
			}
		}
	}()
	wg.Wait()
	<-sampled
	res.elapsed = time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, id := range ids {
		var h struct {
			Events []struct {
				From, To, Reason string
				At               time.Time
			}
		}
		if _, _, err := g.api(ctx, "GET", "/v1/sandboxes/"+id+"/history", nil, &h); err != nil {
			return nil, err
		}
		for _, ev := range h.Events {
			if ev.At.Before(start) {
				continue
			}
			switch {
			case ev.To == "running" && ev.Reason != "create":
				res.wakes++
			case ev.To == "stopped" && (strings.HasPrefix(ev.Reason, "evicted") || strings.HasPrefix(ev.Reason, "pressure")):
				res.evictions++
			case ev.To == "stopped" && ev.Reason == "idle":
				res.idleStops++
			case ev.To == "paused" && ev.Reason == "idle":
				res.idlePauses++
			}
		}
	}
	return soakTable(cfg, res), nil
}

// goroutines reads the goroutine count from the admin endpoint's profile.
func (g *gateway) goroutines(ctx context.Context) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", g.adminURL("/debug/pprof/goroutine?debug=1"), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		return 0, err
	}
	_, n, ok := strings.Cut(strings.TrimSpace(line), "total ")
	if !ok {
		return 0, fmt.Errorf("goroutine profile: unexpected %q", line)
	}
	return strconv.Atoi(n)
}

func soakTable(cfg soakConfig, r *soakResult) *table {
	t := &table{
		title: fmt.Sprintf("Soak: %d clients, %d sandboxes, max_resident %d, %s", cfg.clients, cfg.sandboxes, cfg.maxResident, r.elapsed.Round(time.Second)),
		note: fmt.Sprintf("POST /echo with 0-%d random bytes to a random sandbox, then 0-%s of sleep; idle_pause %s, idle_stop %s, reap_interval %s, reconcile_interval %s, memory_mb %d %s",
			cfg.maxBody, cfg.maxSleep, cfg.idlePause, cfg.idleStop, cfg.reap, cfg.reconcile, cfg.memoryMB, strings.TrimSpace(strings.ReplaceAll(cfg.extra, "\n", "; "))),
	}
	n := float64(r.requests)
	t.add(valueRow("requests", "", n, fmtCount, info))
	t.add(valueRow("correct (200, body echoed intact)", "", float64(r.correct), fmtCount, info))
	t.add(valueRow("bare 502s", "", float64(r.bare502), fmtCount, exactly(0)))
	t.add(valueRow("200 with a wrong body", "", float64(r.wrongBody), fmtCount, exactly(0)))
	codes := make([]string, 0, len(r.byCode))
	for c := range r.byCode {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	for _, c := range codes {
		t.add(valueRow("answered "+c, "", float64(r.byCode[c]), fmtCount, info))
	}
	wpr := 0.0
	if n > 0 {
		wpr = float64(r.wakes) / n
	}
	t.add(valueRow("wakes (paused or stopped → running)", "", float64(r.wakes), fmtCount, info))
	t.add(valueRow("wakes per request", "", wpr, func(f float64) string { return fmt.Sprintf("%.3f", f) }, info))
	t.add(valueRow("evictions (admission or pressure)", "", float64(r.evictions), fmtCount, info))
	t.add(valueRow("idle pauses / idle stops", "", float64(r.idlePauses), func(f float64) string {
		return fmt.Sprintf("%d / %d", r.idlePauses, r.idleStops)
	}, info))
	ds := sortedCopy(r.durs)
	t.add(valueRow("p50 of correct answers", "", percentile(ds, 50).Seconds(), fmtSeconds, info))
	t.add(valueRow("p99 of correct answers", "", percentile(ds, 99).Seconds(), fmtSeconds, info))
	if len(r.rss) > 0 {
		first, last, peak := r.rss[0], r.rss[len(r.rss)-1], r.rss[0]
		for _, v := range r.rss {
			peak = max(peak, v)
		}
		t.add(valueRow("Caddy RSS first / last / peak", "", float64(peak), func(float64) string {
			return fmt.Sprintf("%s / %s / %s", fmtBytes(float64(first)), fmtBytes(float64(last)), fmtBytes(float64(peak)))
		}, info))
	}
	if len(r.goroutines) > 0 {
		first, last, peak := r.goroutines[0], r.goroutines[len(r.goroutines)-1], r.goroutines[0]
		for _, v := range r.goroutines {
			peak = max(peak, v)
		}
		t.add(valueRow("Caddy goroutines first / last / peak", "", float64(peak), func(float64) string {
			return fmt.Sprintf("%d / %d / %d", first, last, peak)
		}, info))
	}
	return t
}
