package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sandwake/sandwake/internal/testenv"
)

// egressCost measures what the egress firewall costs, side by side: one
// gateway with it (the default) and one with `egress unenforced`, each
// creating sandboxes, waking them from stopped and proxying to a running
// one, alternated. The firewall adds netlink commits to a create (the
// sandbox's chain and map entry) and nothing to a wake or a proxied
// request (answers to inbound connections pass its first rule).
func egressCost(ctx context.Context, b *bench, n int) (*table, error) {
	var sides [2]*gateway
	for i, extra := range []string{"egress unenforced", ""} {
		g, err := b.startGateway(ctx, fmt.Sprintf("egress-%d", i), extra, false)
		if err != nil {
			return nil, err
		}
		sides[i] = g
	}
	defer func() {
		for _, g := range sides {
			g.stop()
		}
	}()
	var creates, wakes [2][]time.Duration
	c := loopbackClient(4)
	for i := -1; i < n; i++ { // one untimed round first
		for k := range 2 {
			side := (k + i + 2) % 2 // alternate which side goes first
			g := sides[side]
			id := fmt.Sprintf("e%d%s%d", side, testenv.RunID(), i+1)
			t0 := time.Now()
			if err := g.createSandbox(ctx, id, b.image, 64); err != nil {
				return nil, err
			}
			dc := time.Since(t0)
			if err := g.act(ctx, id, "stop", "stopped"); err != nil {
				return nil, err
			}
			dw, err := firstByte(ctx, c, g.previewURL(id, "/healthz"))
			if err != nil {
				return nil, fmt.Errorf("wake through the gateway with egress %q: %w", g.extra, err)
			}
			if i >= 0 {
				creates[side] = append(creates[side], dc)
				wakes[side] = append(wakes[side], dw)
			}
			if code, body, err := g.api(ctx, "DELETE", "/v1/sandboxes/"+id, nil, nil); err != nil || code != 204 {
				return nil, fmt.Errorf("destroying %s: %d %s %v", id, code, body, err)
			}
		}
	}
	// The hot path: a running sandbox on each side, the same load.
	var thr [2]loadResult
	for side, g := range sides {
		id := fmt.Sprintf("eh%d%s", side, testenv.RunID())
		if err := g.createSandbox(ctx, id, b.image, 256); err != nil {
			return nil, err
		}
		defer g.api(ctx, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	}
	lc := loopbackClient(16)
	req := request{name: "GET /healthz", method: "GET", path: "/healthz", wantLen: 3}
	for round := range 4 {
		side := round % 2
		id := fmt.Sprintf("eh%d%s", side, testenv.RunID())
		r := load(ctx, lc, sides[side].previewURL(id, ""), req, 16, time.Second)
		if r.err != nil {
			return nil, r.err
		}
		thr[side].merge(r)
	}
	progress("egress: create %s → %s, wake %s → %s (means of %d, unenforced → enforced)",
		fmtDuration(mean(creates[0])), fmtDuration(mean(creates[1])), fmtDuration(mean(wakes[0])), fmtDuration(mean(wakes[1])), n)
	t := &table{
		title: "Egress firewall: egress unenforced (baseline) vs enforced (the default)",
		note:  fmt.Sprintf("%d creates and %d wakes from stopped on each gateway, alternated; hot path: 2 × 1 s of GET /healthz at c=16 on each", n, n),
		sides: [2]string{"unenforced", "enforced"},
	}
	cs, ce := sortedCopy(creates[0]), sortedCopy(creates[1])
	ws, we := sortedCopy(wakes[0]), sortedCopy(wakes[1])
	t.add(ratioRow("create → running, mean", mean(cs).Seconds(), mean(ce).Seconds(), fmtSeconds, atMost(1.10)))
	t.add(ratioRow("create → running, p50", percentile(cs, 50).Seconds(), percentile(ce, 50).Seconds(), fmtSeconds, info))
	t.add(ratioRow("wake from stopped → first byte, mean", mean(ws).Seconds(), mean(we).Seconds(), fmtSeconds, atMost(1.10)))
	t.add(ratioRow("wake from stopped → first byte, p50", percentile(ws, 50).Seconds(), percentile(we, 50).Seconds(), fmtSeconds, info))
	t.add(ratioRow("hot path throughput, c=16", thr[0].throughput(), thr[1].throughput(), fmtRate, atLeast(0.90)))
	return t, nil
}

// egressNames measures rules by name against rules by address on the
// enforced gateway, side by side: creates under none with an allow list of
// two addresses, or of two names (which add the sandbox's name sets to the
// batch), each woken from stopped, alternated.
func egressNames(ctx context.Context, b *bench, n int) (*table, error) {
	g, err := b.startGateway(ctx, "egress-names", "", false)
	if err != nil {
		return nil, err
	}
	defer g.stop()
	lists := [2][]string{{"198.51.100.7:443/tcp", "198.51.100.8"}, {"registry.npmjs.org", "*.githubusercontent.com:443"}}
	var creates, wakes [2][]time.Duration
	c := loopbackClient(4)
	for i := -1; i < n; i++ {
		for k := range 2 {
			side := (k + i + 2) % 2
			id := fmt.Sprintf("n%d%s%d", side, testenv.RunID(), i+1)
			t0 := time.Now()
			if err := g.createSandboxWith(ctx, id, b.image, 64, map[string]any{"egress": map[string]any{"policy": "none", "allow": lists[side]}}); err != nil {
				return nil, err
			}
			dc := time.Since(t0)
			if err := g.act(ctx, id, "stop", "stopped"); err != nil {
				return nil, err
			}
			dw, err := firstByte(ctx, c, g.previewURL(id, "/healthz"))
			if err != nil {
				return nil, fmt.Errorf("wake of a sandbox with egress by %s: %w", []string{"address", "name"}[side], err)
			}
			if i >= 0 {
				creates[side] = append(creates[side], dc)
				wakes[side] = append(wakes[side], dw)
			}
			if code, body, err := g.api(ctx, "DELETE", "/v1/sandboxes/"+id, nil, nil); err != nil || code != 204 {
				return nil, fmt.Errorf("destroying %s: %d %s %v", id, code, body, err)
			}
		}
	}
	progress("egress names: create %s → %s, wake %s → %s (means of %d, addresses → names)",
		fmtDuration(mean(creates[0])), fmtDuration(mean(creates[1])), fmtDuration(mean(wakes[0])), fmtDuration(mean(wakes[1])), n)
	t := &table{
		title: "Egress rules by name vs by address (enforced gateway, policy none)",
		note:  fmt.Sprintf("%d creates and %d wakes from stopped with each allow list, alternated; addresses %v, names %v", n, n, lists[0], lists[1]),
		sides: [2]string{"addresses", "names"},
	}
	cs, ce := sortedCopy(creates[0]), sortedCopy(creates[1])
	ws, we := sortedCopy(wakes[0]), sortedCopy(wakes[1])
	t.add(ratioRow("create → running, mean", mean(cs).Seconds(), mean(ce).Seconds(), fmtSeconds, atMost(1.05)))
	t.add(ratioRow("create → running, p50", percentile(cs, 50).Seconds(), percentile(ce, 50).Seconds(), fmtSeconds, info))
	t.add(ratioRow("wake from stopped → first byte, mean", mean(ws).Seconds(), mean(we).Seconds(), fmtSeconds, atMost(1.05)))
	t.add(ratioRow("wake from stopped → first byte, p50", percentile(ws, 50).Seconds(), percentile(we, 50).Seconds(), fmtSeconds, info))
	return t, nil
}
