package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
)

// parallel runs fn for every item with at most conc at a time and returns
// the first error.
func parallel[T any](items []T, conc int, fn func(T) error) error {
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		mu    sync.Mutex
		first error
	)
	for range min(conc, len(items)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(len(items)); i = next.Add(1) - 1 {
				if err := fn(items[i]); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// burstResult is a burst of wakes fired at once.
type burstResult struct {
	durs []time.Duration // per wake, of those that succeeded
	wall time.Duration   // until the last one ended
	errs []error
}

// burst runs wake for every id at once.
func burst(ids []string, wake func(id string) (time.Duration, error)) burstResult {
	var (
		res  burstResult
		mu   sync.Mutex
		wg   sync.WaitGroup
		fire = make(chan struct{})
	)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-fire
			d, err := wake(id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.errs = append(res.errs, fmt.Errorf("%s: %w", id, err))
				return
			}
			res.durs = append(res.durs, d)
		}()
	}
	t0 := time.Now()
	close(fire)
	wg.Wait()
	res.wall = time.Since(t0)
	return res
}

// fleet creates n real sandboxes (memory_mb 16) through the API and stops
// them, wakes them one after another through their preview hosts, then stops
// burstN of them and wakes those all at once. The gateway is then stopped
// and the same burstN containers, stopped again, are started at once with raw
// Docker calls (start, inspect, readiness poll): the burst's baseline.
// rawStart is the baseline of one wake from stopped (raw start + readiness
// poll, wake scenario), when it ran.
func fleet(ctx context.Context, g *gateway, cli *client.Client, image string, n, burstN int, rawStart time.Duration) (*table, error) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("f%s%03d", testenv.RunID(), i)
	}
	t0 := time.Now()
	if err := parallel(ids, 4, func(id string) error { return g.createSandbox(ctx, id, image, 16) }); err != nil {
		return nil, err
	}
	stop := func(id string) error { return g.act(ctx, id, "stop", "stopped") }
	if err := parallel(ids, 4, stop); err != nil {
		return nil, err
	}
	progress("fleet: %d sandboxes created and stopped in %s", n, fmtDuration(time.Since(t0)))

	c := loopbackClient(burstN)
	wakeSW := func(id string) (time.Duration, error) { return firstByte(ctx, c, g.previewURL(id, "/healthz")) }
	seq := make([]time.Duration, 0, n)
	t0 = time.Now()
	for _, id := range ids {
		d, err := wakeSW(id)
		if err != nil {
			return nil, fmt.Errorf("waking %s: %w", id, err)
		}
		seq = append(seq, d)
	}
	seqTotal := time.Since(t0)
	progress("fleet: %d woken in sequence in %s", n, fmtDuration(seqTotal))

	// The burst, interleaved with its baseline: raw twins of the same
	// containers (not sandwake's: its reconcile never sees them), started
	// at once with raw Docker calls while the gateway stays up, for
	// fleetRounds rounds, each kind going first in turn.
	woken := ids[:burstN]
	raws := make(map[string]*rawContainer, burstN)
	for _, id := range woken {
		r, err := newRawTwinNamed(ctx, cli, id, fmt.Sprintf("sandwake-bench-raw-%s-%s", testenv.RunID(), id), false)
		if err != nil {
			return nil, err
		}
		raws[id] = r
	}
	rawWake := func(id string) (time.Duration, error) {
		t0 := time.Now()
		err := raws[id].start(ctx)
		return time.Since(t0), err
	}
	var sws, rawsRes []burstResult
	for round := range fleetRounds {
		if err := parallel(woken, 4, stop); err != nil {
			return nil, err
		}
		if err := parallel(woken, 4, func(id string) error { return raws[id].stop(ctx) }); err != nil {
			return nil, err
		}
		var sw, raw burstResult
		if round%2 == 0 {
			sw, raw = burst(woken, wakeSW), burst(woken, rawWake)
		} else {
			raw, sw = burst(woken, rawWake), burst(woken, wakeSW)
		}
		for _, err := range sw.errs {
			fmt.Printf("   at once through sandwake: %v\n", err)
		}
		for _, err := range raw.errs {
			fmt.Printf("   at once, raw: %v\n", err)
		}
		progress("fleet: round %d: %d woken at once through sandwake in %s, raw in %s", round+1, burstN, fmtDuration(sw.wall), fmtDuration(raw.wall))
		sws, rawsRes = append(sws, sw), append(rawsRes, raw)
	}
	sw, raw := medianBurst(sws), medianBurst(rawsRes)

	t := &table{
		title: fmt.Sprintf("Scale: %d real containers (memory_mb 16), woken from stopped", n),
		note: fmt.Sprintf("sandwake: first byte of a GET to each preview host; baseline of one wake: raw start + readiness poll (p50, wake scenario); baseline of the burst: raw twins of the same %d containers started at once with raw Docker calls + readiness poll, interleaved with sandwake's burst over %d rounds (the round of median wall time of each)",
			burstN, fleetRounds),
	}
	ss := sortedCopy(seq)
	if rawStart > 0 {
		t.add(ratioRow(fmt.Sprintf("%d in sequence: wake p50", n), rawStart.Seconds(), percentile(ss, 50).Seconds(), fmtSeconds, info))
	} else {
		t.add(valueRow(fmt.Sprintf("%d in sequence: wake p50", n), "", percentile(ss, 50).Seconds(), fmtSeconds, info))
	}
	t.add(valueRow(fmt.Sprintf("%d in sequence: wake p99", n), "", percentile(ss, 99).Seconds(), fmtSeconds, info))
	t.add(valueRow(fmt.Sprintf("%d in sequence: total", n), "", seqTotal.Seconds(), fmtSeconds, info))
	t.add(valueRow(fmt.Sprintf("%d at once: answered 200", burstN), "", float64(len(sw.durs)), fmtCount, exactly(float64(burstN))))
	// Issue 21's goal for concurrent wakes against raw Docker.
	t.add(ratioRow(fmt.Sprintf("%d at once: all answered after", burstN), raw.wall.Seconds(), sw.wall.Seconds(), fmtSeconds, atMost(1.10)))
	rs, bs := sortedCopy(raw.durs), sortedCopy(sw.durs)
	t.add(ratioRow(fmt.Sprintf("%d at once: wake p50", burstN), percentile(rs, 50).Seconds(), percentile(bs, 50).Seconds(), fmtSeconds, info))
	return t, nil
}

// fleetRounds is how many times the burst and its baseline run, each kind
// going first in turn.
const fleetRounds = 3

// medianBurst is the burst of median wall time.
func medianBurst(bs []burstResult) burstResult {
	s := slices.Clone(bs)
	slices.SortFunc(s, func(a, b burstResult) int { return cmp.Compare(a.wall, b.wall) })
	return s[len(s)/2]
}
