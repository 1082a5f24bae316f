package docker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// capBits are the capabilities' numbers (linux/capability.h) the tests
// decode /proc/self/status with.
var capBits = map[string]uint{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7,
	"SETPCAP": 8, "LINUX_IMMUTABLE": 9, "NET_BIND_SERVICE": 10, "NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13,
	"IPC_LOCK": 14, "IPC_OWNER": 15, "SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_CHROOT": 18, "SYS_PTRACE": 19,
	"SYS_PACCT": 20, "SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23, "SYS_RESOURCE": 24, "SYS_TIME": 25,
	"SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28, "AUDIT_WRITE": 29, "AUDIT_CONTROL": 30, "SETFCAP": 31,
}

// capNames decodes a capability set in /proc's hex.
func capNames(t *testing.T, hex string) []string {
	t.Helper()
	v, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		t.Fatalf("capability set %q: %v", hex, err)
	}
	var names []string
	for name, bit := range capBits {
		if v&(1<<bit) != 0 {
			names = append(names, name)
		}
	}
	if v>>32 != 0 {
		names = append(names, fmt.Sprintf("bits above 31: %#x", v>>32))
	}
	return sortedStrings(names)
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// selfOf is what the sandbox's app reports of itself (testapp's /self).
type selfOf struct {
	UID        int    `json:"uid"`
	GID        int    `json:"gid"`
	CapEff     string `json:"cap_eff"`
	CapBnd     string `json:"cap_bnd"`
	NoNewPrivs string `json:"no_new_privs"`
	Seccomp    string `json:"seccomp"`
	NofileSoft uint64 `json:"nofile_soft"`
	NofileHard uint64 `json:"nofile_hard"`
	RootWrite  string `json:"root_write"`
	TmpWrite   string `json:"tmp_write"`
	TmpBytes   uint64 `json:"tmp_bytes"`
}

func readSelf(t *testing.T, rec lifecycle.Record) selfOf {
	t.Helper()
	code, body := get(t, upstream(t, rec), "/self")
	var s selfOf
	if code != 200 || json.Unmarshal([]byte(body), &s) != nil {
		t.Fatalf("/self: %d %q", code, body)
	}
	return s
}

// TestSandboxIsolation reads, from inside real sandboxes, what they run
// with: the documented capability minimum (MKNOD, NET_RAW, SETFCAP,
// SETPCAP, AUDIT_WRITE, SYS_CHROOT gone), no_new_privs, the engine's
// seccomp filter, the nofile limit; a non-root user holding no capability;
// a read-only root with a bounded, writable /tmp; cap_add giving back one
// of Docker's defaults and nothing beyond them; a runtime the engine lacks
// refused with its name.
func TestSandboxIsolation(t *testing.T) {
	f := newFixture(t, lifecycle.Config{})
	want := sortedStrings(lifecycle.SandboxCapabilities)

	t.Run("defaults", func(t *testing.T) {
		s := readSelf(t, f.create(lifecycle.Spec{}))
		if got := capNames(t, s.CapEff); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("effective capabilities of root in the sandbox: %v, want %v", got, want)
		}
		if got := capNames(t, s.CapBnd); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("bounding set: %v, want %v", got, want)
		}
		if s.UID != 0 || s.NoNewPrivs != "1" || s.NofileSoft != 4096 || s.NofileHard != 4096 {
			t.Errorf("uid %d no_new_privs %q nofile %d/%d, want 0 1 4096/4096", s.UID, s.NoNewPrivs, s.NofileSoft, s.NofileHard)
		}
		if s.Seccomp != "2" {
			t.Errorf("seccomp mode %q, want 2 (the engine's default filter)", s.Seccomp)
		}
		if s.RootWrite != "" {
			t.Errorf("writing / in a sandbox with a writable root: %s", s.RootWrite)
		}
	})

	t.Run("non-root, read-only, cap_add", func(t *testing.T) {
		ro := true
		rec := f.create(lifecycle.Spec{User: "65534:65534", ReadonlyRootfs: &ro, CapAdd: []string{"cap_sys_chroot"}})
		if rec.Spec.User != "65534:65534" || rec.Spec.ReadonlyRootfs == nil || !*rec.Spec.ReadonlyRootfs || len(rec.Spec.CapAdd) != 1 || rec.Spec.CapAdd[0] != "SYS_CHROOT" {
			t.Fatalf("record's spec: user %q readonly %v cap_add %v", rec.Spec.User, rec.Spec.ReadonlyRootfs, rec.Spec.CapAdd)
		}
		s := readSelf(t, rec)
		if s.UID != 65534 || s.GID != 65534 {
			t.Errorf("uid:gid %d:%d, want 65534:65534", s.UID, s.GID)
		}
		if got := capNames(t, s.CapEff); len(got) != 0 {
			t.Errorf("effective capabilities of a non-root sandbox: %v, want none", got)
		}
		wantBnd := sortedStrings(append(append([]string(nil), lifecycle.SandboxCapabilities...), "SYS_CHROOT"))
		if got := capNames(t, s.CapBnd); strings.Join(got, ",") != strings.Join(wantBnd, ",") {
			t.Errorf("bounding set with cap_add SYS_CHROOT: %v, want %v", got, wantBnd)
		}
		if !strings.Contains(s.RootWrite, "read-only") {
			t.Errorf("writing / on a read-only root: %q, want a read-only file system error", s.RootWrite)
		}
		if s.TmpWrite != "" || s.TmpBytes != 64<<20 {
			t.Errorf("/tmp: write %q, size %d, want writable and %d bytes", s.TmpWrite, s.TmpBytes, 64<<20)
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, tt := range []struct {
			name    string
			spec    lifecycle.Spec
			wantErr string
		}{
			{"a capability beyond Docker's defaults", lifecycle.Spec{CapAdd: []string{"SYS_ADMIN"}}, `cap_add: "SYS_ADMIN" cannot be given`},
			{"a user that is not one", lifecycle.Spec{User: "root;rm"}, "user:"},
			{"a runtime the engine lacks", lifecycle.Spec{Runtime: "sandwake-no-such-runtime"}, "sandwake-no-such-runtime"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				tt.spec.Image, tt.spec.Ports = f.image, []int{8080}
				id := testenv.UniqueID("t")
				_, err := f.m.Create(context.Background(), lifecycle.CreateRequest{ID: id, Spec: tt.spec})
				if !errors.Is(err, lifecycle.ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("create: %v, want ErrInvalid naming %q", err, tt.wantErr)
				}
				if _, err := f.store.Get(id); !errors.Is(err, lifecycle.ErrNotFound) {
					t.Fatalf("a refused create left a record: %v", err)
				}
			})
		}
	})
}
