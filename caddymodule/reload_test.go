package caddymodule

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandwake/sandwake/internal/testenv"
)

func TestReloadsDropNothing(t *testing.T) {
	h := newHarness(t, "")
	rec := h.create(nil)
	host := h.host(rec.ID, 8080)
	before := testutil.ToFloat64(metricRequests.WithLabelValues(outcomeProxied))
	eng := engineFor(t, h)

	var (
		wg     sync.WaitGroup
		stop   atomic.Bool
		ok     atomic.Int64
		failed = make(chan string, 1000)
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				resp, body := h.preview("GET", host, "/healthz", nil, nil)
				if resp.StatusCode != 200 || body != "ok\n" {
					failed <- fmt.Sprintf("%d %q", resp.StatusCode, body)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	waitCount := func(min int64) {
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			return ok.Load() >= min, fmt.Sprintf("%d requests", ok.Load())
		})
	}
	waitCount(50)
	h.load("hold_timeout 30s")
	waitCount(ok.Load() + 50)
	h.load("hold_timeout 45s")
	waitCount(ok.Load() + 50)
	stop.Store(true)
	wg.Wait()
	close(failed)
	for f := range failed {
		t.Error("request failed across reload:", f)
	}
	if got := engineFor(t, h); got != eng {
		t.Fatal("a reload opened a second engine (store)")
	}
	if refs, _ := engines.References(eng.Core.Dir()); refs != 1 {
		t.Fatalf("engine references = %d, want 1 after reloads", refs)
	}
	after := testutil.ToFloat64(metricRequests.WithLabelValues(outcomeProxied))
	if after-before < float64(ok.Load()) {
		t.Fatalf("proxied counter grew by %v for %d requests", after-before, ok.Load())
	}
	if hold := eng.Current.Load().HoldTimeout; hold != 45*time.Second {
		t.Fatalf("reloaded hold_timeout = %s", hold)
	}
}
