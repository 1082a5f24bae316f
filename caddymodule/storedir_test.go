package caddymodule_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sandwake/sandwake/internal/gatewaytest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestStoreDirNotWritable: a sandwake app whose storage cannot be created
// (its path runs through a regular file, which stops root too) fails
// caddy.Load with an error naming the path and what failed, without a panic
// and without leaving goroutines behind.
func TestStoreDirNotWritable(t *testing.T) {
	gatewaytest.LockCaddy(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("not a directory\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	previewPort, apiPort := gatewaytest.FreePort(t), gatewaytest.FreePort(t)
	load := func(storage string) error {
		src := fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	storage file_system %s
	sandwake {
		storage %s
		label %s %s
	}
}
http://*.preview.localhost:%d {
	bind 127.0.0.1
	sandwake_preview
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	sandwake_api {
		token %s
	}
}
`, filepath.Join(dir, "caddy"), storage, testenv.LabelRun, testenv.RunID(), previewPort, apiPort, gatewaytest.Token)
		cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
		if err != nil {
			t.Fatalf("adapting Caddyfile: %v", err)
		}
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("caddy.Load panicked with storage %s: %v", storage, r)
			}
		}()
		return caddy.Load(cfg, true)
	}
	goroutines := func() int {
		http.DefaultClient.CloseIdleConnections()
		return runtime.NumGoroutine()
	}

	tests := []struct {
		name    string
		storage string
	}{
		{"below a regular file", filepath.Join(file, "sub")},
		{"deeper below a regular file", filepath.Join(file, "a", "b")},
		{"a regular file", file},
	}
	// One load first: Caddy starts process-wide goroutines once, on the
	// first config, that are not the failed config's to stop.
	if err := load(tests[0].storage); err == nil {
		t.Fatalf("caddy.Load with storage %s succeeded", tests[0].storage)
	}
	baseline := goroutines()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range 3 {
				err := load(tt.storage)
				if err == nil {
					t.Fatalf("caddy.Load with storage %s succeeded", tt.storage)
				}
				if i == 0 {
					t.Logf("error: %v", err)
				}
				msg := err.Error()
				if !strings.Contains(msg, tt.storage) {
					t.Errorf("error does not name the storage path %s: %v", tt.storage, err)
				}
				if !strings.Contains(msg, "not a directory") || !strings.Contains(msg, "store") {
					t.Errorf("error does not say what failed (opening the store: not a directory): %v", err)
				}
			}
		})
	}
	// Nothing kept listening: no socket of this process listens on the
	// ports. (Binding them to check would race with other processes, such
	// as Docker's proxy, that may take a freed ephemeral port meanwhile.)
	// Checked until a deadline: were a server started, net/http closes a
	// listener in Serve's goroutine, which may run after Shutdown returned.
	for _, port := range []int{previewPort, apiPort} {
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			return !listeningHere(t, port), fmt.Sprintf("port %d still listened on by this process after the failed loads", port)
		})
	}
	var now int
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		now = goroutines()
		return now <= baseline+2, fmt.Sprintf("%d goroutines after %d failed loads, %d after the first", now, 3*len(tests), baseline)
	})
	t.Logf("goroutines: %d after the first failed load, %d after %d more", baseline, now, 3*len(tests))
}

// listeningHere reports whether a socket of this process listens on
// 127.0.0.1:port, from /proc/net/tcp and this process's descriptors.
func listeningHere(t *testing.T, port int) bool {
	t.Helper()
	tcp, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatalf("reading /proc/net/tcp: %v", err)
	}
	local := fmt.Sprintf("0100007F:%04X", port)
	inodes := map[string]bool{}
	for _, line := range strings.Split(string(tcp), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == local && f[3] == "0A" { // 0A: LISTEN
			inodes["socket:["+f[9]+"]"] = true
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("reading /proc/self/fd: %v", err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && inodes[target] {
			return true
		}
	}
	return false
}

func TestListeningHere(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if !listeningHere(t, port) {
		t.Fatalf("a listener of this process on %d is not seen", port)
	}
	l.Close()
	if listeningHere(t, port) {
		t.Fatalf("a closed listener on %d is still seen", port)
	}
}
