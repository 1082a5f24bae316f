package caddymodule_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandwake/sandwake/caddymodule"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/preview"
)

func TestReloadsDropNothing(t *testing.T) {
	h := newHarness(t, "")
	rec := h.Create(nil)
	host := h.Host(rec.ID, 8080)
	before := proxiedRequests(t)
	eng := gatewayOf(t)

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
				resp, body := h.Preview("GET", host, "/healthz", nil, nil)
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
	h.Load("hold_timeout 30s")
	waitCount(ok.Load() + 50)
	h.Load("hold_timeout 45s")
	waitCount(ok.Load() + 50)
	stop.Store(true)
	wg.Wait()
	close(failed)
	for f := range failed {
		t.Error("request failed across reload:", f)
	}
	if got := gatewayOf(t); got != eng {
		t.Fatal("a reload opened a second engine (store)")
	}
	if refs := caddymodule.EngineReferences(eng.Core.Dir()); refs != 1 {
		t.Fatalf("engine references = %d, want 1 after reloads", refs)
	}
	after := proxiedRequests(t)
	if after-before < float64(ok.Load()) {
		t.Fatalf("proxied counter grew by %v for %d requests", after-before, ok.Load())
	}
	if hold := eng.Current.Load().HoldTimeout; hold != 45*time.Second {
		t.Fatalf("reloaded hold_timeout = %s", hold)
	}
}

// gatewayOf is the running gateway.
func gatewayOf(t testing.TB) *gateway.Gateway {
	t.Helper()
	g := gateway.Current()
	if g == nil {
		t.Fatal("no gateway running")
	}
	return g
}

// proxiedRequests is caddy_sandwake_requests_total{outcome="proxied"}, read
// from the preview path's collectors.
func proxiedRequests(t testing.TB) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(preview.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "caddy_sandwake_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == "proxied" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
