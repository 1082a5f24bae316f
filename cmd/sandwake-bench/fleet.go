package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle/docker"
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

	woken := ids[:burstN]
	if err := parallel(woken, 4, stop); err != nil {
		return nil, err
	}
	sw := burst(woken, wakeSW)
	for _, err := range sw.errs {
		fmt.Printf("   at once through sandwake: %v\n", err)
	}
	progress("fleet: %d woken at once through sandwake in %s", burstN, fmtDuration(sw.wall))

	// The baseline, with sandwake out of the way.
	g.stop()
	raws := make(map[string]*rawContainer, burstN)
	for _, id := range woken {
		raws[id] = &rawContainer{cli: cli, name: docker.ContainerName(id)}
	}
	if err := parallel(woken, 4, func(id string) error { return raws[id].stop(ctx) }); err != nil {
		return nil, err
	}
	raw := burst(woken, func(id string) (time.Duration, error) {
		t0 := time.Now()
		err := raws[id].start(ctx)
		return time.Since(t0), err
	})
	for _, err := range raw.errs {
		fmt.Printf("   at once, raw: %v\n", err)
	}
	progress("fleet: %d started at once with raw Docker calls in %s", burstN, fmtDuration(raw.wall))

	t := &table{
		title: fmt.Sprintf("Scale: %d real containers (memory_mb 16), woken from stopped", n),
		note: fmt.Sprintf("sandwake: first byte of a GET to each preview host; baseline of one wake: raw start + readiness poll (p50, wake scenario); baseline of the burst: the same %d containers started at once with raw Docker calls + readiness poll, sandwake stopped",
			burstN),
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
	t.add(ratioRow(fmt.Sprintf("%d at once: all answered after", burstN), raw.wall.Seconds(), sw.wall.Seconds(), fmtSeconds, info))
	rs, bs := sortedCopy(raw.durs), sortedCopy(sw.durs)
	t.add(ratioRow(fmt.Sprintf("%d at once: wake p50", burstN), percentile(rs, 50).Seconds(), percentile(bs, 50).Seconds(), fmtSeconds, info))
	return t, nil
}
