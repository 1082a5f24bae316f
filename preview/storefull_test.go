package preview_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandwake/sandwake/client"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// mountTmpfs mounts a tmpfs of size (e.g. "128m") on a new directory and
// unmounts it at the end of the test, after everything registered later
// (Caddy, the store) has been cleaned up.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("blocked: mounting a tmpfs to fill needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("blocked: cannot mount a tmpfs here: %v: %s", err, out)
	}
	// Registered after TempDir, so it runs before the directory is removed.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillTo fills the file system of dir until left bytes are free, with one
// file it returns (remove it to free the space).
func fillTo(t *testing.T, dir string, left int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	if free <= left {
		t.Fatalf("only %d bytes free, want more than %d", free, left)
	}
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, free-left); err != nil {
		t.Fatalf("filling %s: %v", dir, err)
	}
	return path
}

// readyzView is the body of GET /v1/readyz.
type readyzView struct {
	Ready  bool              `json:"ready"`
	Checks map[string]string `json:"checks"`
}

func (h *harness) readyz() (int, readyzView) {
	h.T.Helper()
	req, _ := http.NewRequest("GET", h.APIURL("/v1/readyz"), nil)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.Token) // the details need a token
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.T.Fatal(err)
	}
	defer resp.Body.Close()
	var v readyzView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		h.T.Fatalf("readyz body: %v", err)
	}
	return resp.StatusCode, v
}

// TestStoreFullWhileRunning: with the store's file system filled below its
// reserve, a stop that Docker carries out but the store cannot record
// answers 503 store_unavailable saying so (not 502); readyz is 503 naming
// the store; a preview request gets 503 + Retry-After (JSON, or a page for a
// browser), never a bare 502. Once space is freed the record becomes stopped
// with no API call (the periodic reconcile is an hour away), readyz is 200
// again, and a preview request wakes the sandbox and is answered by it.
func TestStoreFullWhileRunning(t *testing.T) {
	mnt := mountTmpfs(t, "128m")
	storeDir := filepath.Join(mnt, "sandwake")
	h := newHarnessWithCaddyfile(t, func(h *harness) string {
		return strings.Replace(h.Caddyfile("reconcile_interval 1h"),
			"storage "+filepath.Join(h.Dir, "sandwake"), "storage "+storeDir, 1)
	})
	rec := h.Create(nil)
	id, host := rec.ID, h.Host(rec.ID, 8080)
	if resp, body := h.Preview("GET", host, "/", nil, nil); resp.StatusCode != 200 {
		t.Fatalf("preview before filling: %d %s", resp.StatusCode, body)
	}

	filler := fillTo(t, mnt, 16<<20) // below the store's 64 MiB reserve
	status, ready := h.readyz()
	if status != http.StatusServiceUnavailable || !strings.Contains(ready.Checks["store"], storeDir) || !strings.Contains(ready.Checks["store"], "no space left") {
		t.Fatalf("readyz with the store full: %d %+v; want 503 with a store check naming %s and the lack of space", status, ready, storeDir)
	}
	t.Logf("readyz store check: %s", ready.Checks["store"])

	req, _ := http.NewRequest("POST", h.APIURL("/v1/sandboxes/"+id+"/stop"), nil)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var apiErr client.ErrorResponse
	json.Unmarshal(b, &apiErr)
	if resp.StatusCode != http.StatusServiceUnavailable || apiErr.Error.Code != "store_unavailable" || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(apiErr.Error.Message, "the container was stopped, but the store could not record it") {
		t.Fatalf("stop with the store full: %d (Retry-After %q) %s; want 503 store_unavailable saying the container was stopped but not recorded",
			resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	t.Logf("stop: %d %s", resp.StatusCode, apiErr.Error.Message)
	if got := gatewaytest.DockerRecordState(t, h.Docker, id); got != "stopped" {
		t.Fatalf("Docker after the stop: %s, want the container stopped", got)
	}
	if got := h.State(id); got != "running" {
		t.Fatalf("record while the store is full: %s, want running as last committed", got)
	}

	resp, body := h.Preview("GET", host, "/", nil, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, `"store_unavailable"`) {
		t.Fatalf("preview request with the store full: %d (Retry-After %q) %s; want 503 store_unavailable with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if strings.Contains(body, mnt) {
		t.Fatalf("preview answer shows the store's path to a visitor: %s", body)
	}
	resp, body = h.Preview("GET", host, "/", nil, gatewaytest.BrowserHeader())
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(body, "cannot record changes") {
		t.Fatalf("browser page load with the store full: %d %s %.300s; want a 503 page", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		s := h.State(id)
		return s == "stopped", "record is " + s
	})
	if status, ready := h.readyz(); status != http.StatusOK {
		t.Fatalf("readyz once space is back: %d %+v", status, ready)
	}
	resp, body = h.Preview("GET", host, "/", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("preview once space is back: %d %s; want the woken app's 200", resp.StatusCode, body)
	}
	if got := h.State(id); got != "running" {
		t.Fatalf("record after the wake: %s", got)
	}
}
