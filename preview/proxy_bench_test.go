package preview_test

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/gatewaytest"
)

// BenchmarkProxiedRequest sends the same small GET through one in-process
// Caddy twice over: a plain `reverse_proxy` site to the sandbox's published
// port, and the sandwake_preview site, interleaved. It reports the mean time
// and the heap allocations per request of each (client, server and proxy
// together; their difference is what sandwake adds) and the ratios.
//
//	go test -run '^$' -bench ProxiedRequest -benchtime 2000x ./preview/
func BenchmarkProxiedRequest(b *testing.B) {
	h := newHarness(b, "idle_pause 0\n\t\tidle_stop 0")
	rec := h.Create(nil)
	full, err := gateway.Current().Mgr.Get(rec.ID)
	if err != nil {
		b.Fatal(err)
	}
	plainPort := gatewaytest.FreePort(b)
	cfg := h.Caddyfile("idle_pause 0\n\t\tidle_stop 0") + fmt.Sprintf(`
http://127.0.0.1:%d {
	bind 127.0.0.1
	reverse_proxy %s
}
`, plainPort, full.Upstreams[8080])
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := caddy.Load(adapted, true); err != nil {
		b.Fatal(err)
	}
	h.WaitReady()

	plainURL := fmt.Sprintf("http://127.0.0.1:%d/healthz", plainPort)
	previewURL := "http://" + h.Host(rec.ID, 8080) + "/healthz"
	plain := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	get := func(c *http.Client, url string) {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %d", url, resp.StatusCode)
		}
	}
	for range 200 { // warm both paths and their connection pools
		get(plain, plainURL)
		get(h.Client, previewURL)
	}
	var (
		ms                   runtime.MemStats
		plainAllocs, swAlloc uint64
		plainTime, swTime    time.Duration
	)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runtime.ReadMemStats(&ms)
		before, t0 := ms.Mallocs, time.Now()
		get(plain, plainURL)
		plainTime += time.Since(t0)
		runtime.ReadMemStats(&ms)
		plainAllocs += ms.Mallocs - before

		before, t0 = ms.Mallocs, time.Now()
		get(h.Client, previewURL)
		swTime += time.Since(t0)
		runtime.ReadMemStats(&ms)
		swAlloc += ms.Mallocs - before
	}
	n := float64(b.N)
	b.ReportMetric(float64(plainAllocs)/n, "plain-allocs/req")
	b.ReportMetric(float64(swAlloc)/n, "sandwake-allocs/req")
	b.ReportMetric(float64(plainTime.Microseconds())/n, "plain-µs/req")
	b.ReportMetric(float64(swTime.Microseconds())/n, "sandwake-µs/req")
	b.ReportMetric(float64(swTime)/float64(plainTime), "time-ratio")
	b.ReportMetric(0, "ns/op")
}
