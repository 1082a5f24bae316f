package caddymodule

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestIsolationOptions: user, readonly_rootfs, tmp_mb, default_cpus, nofile
// and runtime are parsed into the app and the manager's defaults, and bad
// values are refused naming the option.
func TestIsolationOptions(t *testing.T) {
	tests := []struct {
		name    string
		input   string
		wantErr string
		check   func(t *testing.T, a *App)
	}{
		{"defaults", "", "", func(t *testing.T, a *App) {
			iso := a.managerSettings().Isolation
			if iso.User != "" || iso.ReadonlyRootfs || iso.Runtime != "" || iso.CPUs != 0 || a.Nofile != 0 || a.TmpMB != 0 {
				t.Fatalf("defaults: %+v nofile %d tmp_mb %d", iso, a.Nofile, a.TmpMB)
			}
		}},
		{"all set", "user 1000:1000\nreadonly_rootfs\ntmp_mb 128\ndefault_cpus 0.5\nnofile 1024\nruntime runsc", "", func(t *testing.T, a *App) {
			iso := a.managerSettings().Isolation
			if iso.User != "1000:1000" || !iso.ReadonlyRootfs || iso.Runtime != "runsc" || iso.CPUs != 0.5 || a.Nofile != 1024 || a.TmpMB != 128 {
				t.Fatalf("got %+v nofile %d tmp_mb %d", iso, a.Nofile, a.TmpMB)
			}
		}},
		{"readonly_rootfs off", "readonly_rootfs off", "", func(t *testing.T, a *App) {
			if a.ReadonlyRootfs {
				t.Fatal("readonly_rootfs off left it on")
			}
		}},
		{"readonly_rootfs maybe", "readonly_rootfs maybe", "readonly_rootfs", nil},
		{"user with a space", `user "a b"`, "user", nil},
		{"runtime path", "runtime /usr/bin/runsc", "runtime", nil},
		{"cpus not a number", "default_cpus many", "default_cpus", nil},
		{"cpus negative", "default_cpus -1", "default_cpus", nil},
		{"nofile zero", "nofile 0", "nofile", nil},
		{"nofile huge", "nofile 99999999", "nofile", nil},
		{"tmp_mb not a number", "tmp_mb 1G", "tmp_mb", nil},
		{"default disk", "default_disk 2GiB\ndisk_check_interval 10s", "", func(t *testing.T, a *App) {
			if a.managerSettings().Isolation.DiskMB != 2048 || a.DiskCheckInterval != caddy.Duration(10*time.Second) {
				t.Fatalf("disk %d MiB, interval %s", a.managerSettings().Isolation.DiskMB, time.Duration(a.DiskCheckInterval))
			}
		}},
		{"default disk off", "default_disk 0", "", func(t *testing.T, a *App) {
			if a.managerSettings().Isolation.DiskMB != 0 {
				t.Fatalf("disk %d MiB, want none", a.managerSettings().Isolation.DiskMB)
			}
		}},
		{"default disk 10 GiB by default", "", "", func(t *testing.T, a *App) {
			if a.managerSettings().Isolation.DiskMB != 10240 {
				t.Fatalf("disk %d MiB, want 10240", a.managerSettings().Isolation.DiskMB)
			}
		}},
		{"default disk share", "default_disk 10%", "default_disk", nil},
		{"default disk nonsense", "default_disk lots", "default_disk", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkOption(t, tt.input, tt.wantErr, tt.check) })
	}
}
