package gateway_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/gateway"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestDiskQuotaThroughTheGateway: on the real engine, a sandbox created
// with disk_mb that writes past it is stopped with reason disk_quota and
// counted; the API shows its quota and what it used while it ran; a
// visitor's request then gets 507 disk_quota and wakes nothing; an API
// wake still works (the operator's choice).
func TestDiskQuotaThroughTheGateway(t *testing.T) {
	h := newHarness(t, "disk_check_interval 200ms\n\t\tdefault_disk 1GiB")
	before := testutil.ToFloat64(gateway.MetricDiskQuotaStops)
	status, rec := h.CreateWith(map[string]any{"disk_mb": 16})
	if status != http.StatusCreated || rec.DiskMB != 16 {
		t.Fatalf("create with disk_mb 16: %d %+v", status, rec)
	}
	other := h.Create(nil)
	if other.DiskMB != 1024 {
		t.Fatalf("a create without disk_mb has disk_mb %d, want default_disk's 1024", other.DiskMB)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		var v client.Sandbox
		h.API("GET", "/v1/sandboxes/"+rec.ID, nil, &v)
		return v.DiskUsedMB != nil, "waiting for a measure in the API"
	})
	host := h.Host(rec.ID, 8080)
	if resp, body := h.Preview("GET", host, "/fill?path=/workspace/big&mb=24", nil, gatewaytest.APIHeader()); resp.StatusCode != 200 {
		t.Fatalf("fill: %d %q", resp.StatusCode, body)
	}
	testenv.Eventually(t, 15*time.Second, func() (bool, string) {
		var v client.Sandbox
		h.API("GET", "/v1/sandboxes/"+rec.ID, nil, &v)
		return v.State == "stopped" && v.Reason == "disk_quota", v.State + " " + v.Reason
	})
	// The metric is counted once the stop is recorded.
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		got := testutil.ToFloat64(gateway.MetricDiskQuotaStops) - before
		return got >= 1, fmt.Sprintf("disk_quota_stops_total grew by %v, want 1", got)
	})
	since := time.Now()
	resp, body := h.Preview("GET", host, "/healthz", nil, gatewaytest.APIHeader())
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(body, "disk_quota") {
		t.Fatalf("request to a sandbox stopped over its quota: %d %q, want 507 disk_quota", resp.StatusCode, body)
	}
	resp, body = h.Preview("GET", host, "/", nil, gatewaytest.BrowserHeader())
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(body, "quota") {
		t.Fatalf("page load: %d, want 507 with a page naming the quota:\n%.500s", resp.StatusCode, body)
	}
	if n := h.StartEvents(rec.ID, since); n != 0 {
		t.Fatalf("visits woke the sandbox over its quota (%d starts)", n)
	}
	if code := h.API("POST", "/v1/sandboxes/"+rec.ID+"/wake", nil, nil); code != 200 {
		t.Fatalf("API wake of a sandbox stopped over its quota: %d, want 200", code)
	}
}
