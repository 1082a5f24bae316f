package docker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
	"github.com/sandwake/sandwake/lifecycle/docker"
)

// TestDiskQuotaStopsTheSandbox: on the real engine, a sandbox that writes
// past its disk_mb, in its workspace or in its container's writable layer,
// is stopped by the watchdog with reason disk_quota (an event, the hook);
// one that stays under keeps running, and what it wrote is measured.
func TestDiskQuotaStopsTheSandbox(t *testing.T) {
	var mu sync.Mutex
	over := map[string]int64{}
	f := newFixture(t, lifecycle.Config{DiskInterval: 200 * time.Millisecond, OnDiskQuota: func(id string, used, quota int64) {
		mu.Lock()
		over[id] = used
		mu.Unlock()
	}})
	under := f.create(lifecycle.Spec{DiskMB: 64})
	if code, body := get(t, upstream(t, under), "/fill?path=/workspace/some&mb=8"); code != 200 {
		t.Fatalf("fill under the quota: %d %q", code, body)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		used, ok := f.m.DiskUsed(under.ID)
		return ok && used >= 8<<20 && used < 64<<20, "waiting for the watchdog to measure 8 MiB"
	})

	for _, path := range []string{"/workspace/big", "/big"} {
		t.Run(path, func(t *testing.T) {
			rec := f.create(lifecycle.Spec{DiskMB: 16})
			if rec.Spec.DiskMB != 16 {
				t.Fatalf("disk_mb %d in the record", rec.Spec.DiskMB)
			}
			code, body := get(t, upstream(t, rec), "/fill?path="+path+"&mb=24")
			if code != 200 && code != 507 { // 507: a hard quota stopped the write
				t.Fatalf("fill past the quota: %d %q", code, body)
			}
			// The hook runs once the stop is recorded: both are waited for.
			var used int64
			testenv.Eventually(t, 15*time.Second, func() (bool, string) {
				got, err := f.store.Get(rec.ID)
				mu.Lock()
				used = over[rec.ID]
				mu.Unlock()
				return err == nil && got.State == lifecycle.Stopped && got.Reason == lifecycle.ReasonDiskQuota && used > 0,
					fmt.Sprintf("state %s %s, hook saw %d bytes", got.State, got.Reason, used)
			})
			if code == 200 && used <= 16<<20 {
				t.Fatalf("the hook saw %d bytes used, want over 16 MiB", used)
			}
			hist, _ := f.m.History(rec.ID)
			if last := hist[len(hist)-1]; last.To != lifecycle.Stopped || last.Reason != lifecycle.ReasonDiskQuota {
				t.Fatalf("last event %+v, want stopped disk_quota", last)
			}
		})
	}
	if got := mustState(t, f.store, under.ID, lifecycle.Running); got.Reason == lifecycle.ReasonDiskQuota {
		t.Fatal("the sandbox under its quota was stopped")
	}
}

// BenchmarkDiskWatchdogPass measures one watchdog pass's walk over 1,000
// sandboxes' directories on the host (each a workspace of 60 files in 3
// directories and a writable layer of 20 files), as DiskUsage walks them.
func BenchmarkDiskWatchdogPass(b *testing.B) {
	root := b.TempDir()
	const sandboxes = 1000
	dirs := make([][2]string, sandboxes)
	chunk := make([]byte, 3000)
	for i := range sandboxes {
		ws := filepath.Join(root, "v", string(rune('a'+i%26)), filepathID(i))
		up := filepath.Join(root, "u", filepathID(i))
		for d := range 3 {
			dir := filepath.Join(ws, "d"+string(rune('0'+d)))
			os.MkdirAll(dir, 0o700)
			for f := range 20 {
				os.WriteFile(filepath.Join(dir, "f"+filepathID(f)), chunk, 0o600)
			}
		}
		os.MkdirAll(up, 0o700)
		for f := range 20 {
			os.WriteFile(filepath.Join(up, "f"+filepathID(f)), chunk, 0o600)
		}
		dirs[i] = [2]string{ws, up}
	}
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		for _, d := range dirs {
			if _, err := docker.DirUsage(ctx, d[0], d[1]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/sandboxes, "µs/sandbox")
}

func filepathID(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return filepathID(i/10) + digits[i%10:i%10+1]
}
