package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestNormalizeSpec(t *testing.T) {
	neg := -time.Second
	zero := time.Duration(0)
	tests := []struct {
		name    string
		mutate  func(s *Spec)
		wantErr string // the field named in the error; "" means valid
	}{
		{"minimal", func(s *Spec) {}, ""},
		{"no image", func(s *Spec) { s.Image = "" }, "image"},
		{"blank image", func(s *Spec) { s.Image = " \t" }, "image"},
		{"image with space", func(s *Spec) { s.Image = "busy box" }, "image"},
		{"no ports", func(s *Spec) { s.Ports = nil }, "ports"},
		{"port 0", func(s *Spec) { s.Ports = []int{0} }, "ports"},
		{"port 65536", func(s *Spec) { s.Ports = []int{65536} }, "ports"},
		{"negative port", func(s *Spec) { s.Ports = []int{-80} }, "ports"},
		{"port 1 and 65535", func(s *Spec) { s.Ports = []int{1, 65535} }, ""},
		{"duplicate port", func(s *Spec) { s.Ports = []int{8080, 9000, 8080} }, "ports"},
		{"16 ports", func(s *Spec) { s.Ports = portRange(MaxPorts) }, ""},
		{"17 ports", func(s *Spec) { s.Ports = portRange(MaxPorts + 1) }, "ports"},
		{"empty env name", func(s *Spec) { s.Env = map[string]string{"": "x"} }, "env"},
		{"env name with =", func(s *Spec) { s.Env = map[string]string{"A=B": "x"} }, "env"},
		{"env name with nul", func(s *Spec) { s.Env = map[string]string{"A\x00": "x"} }, "env"},
		{"env ok", func(s *Spec) { s.Env = map[string]string{"PATH": "/bin", "EMPTY": ""} }, ""},
		{"memory 3", func(s *Spec) { s.MemoryMB = 3 }, "memory_mb"},
		{"memory negative", func(s *Spec) { s.MemoryMB = -1 }, "memory_mb"},
		{"memory minimum", func(s *Spec) { s.MemoryMB = MinMemoryMB }, ""},
		{"memory unset", func(s *Spec) { s.MemoryMB = 0 }, ""},
		{"cpus negative", func(s *Spec) { s.CPUs = -0.5 }, "cpus"},
		{"cpus too many", func(s *Spec) { s.CPUs = 1025 }, "cpus"},
		{"cpus fraction", func(s *Spec) { s.CPUs = 0.25 }, ""},
		{"pids negative", func(s *Spec) { s.PidsLimit = -1 }, "pids_limit"},
		{"workspace root", func(s *Spec) { s.WorkspacePath = "/" }, "workspace_path"},
		{"workspace cleans to root", func(s *Spec) { s.WorkspacePath = "/data/.." }, "workspace_path"},
		{"workspace relative", func(s *Spec) { s.WorkspacePath = "workspace" }, "workspace_path"},
		{"workspace dot relative", func(s *Spec) { s.WorkspacePath = "./workspace" }, "workspace_path"},
		{"ready path relative", func(s *Spec) { s.ReadyPath = "healthz" }, "ready_path"},
		{"ready path", func(s *Spec) { s.ReadyPath = "/healthz" }, ""},
		{"ready mode bad", func(s *Spec) { s.ReadyMode = "grpc" }, "ready_mode"},
		{"ready mode upper case", func(s *Spec) { s.ReadyMode = "HTTP" }, "ready_mode"},
		{"ready mode tcp", func(s *Spec) { s.ReadyMode = ReadyTCP }, ""},
		{"idle pause negative", func(s *Spec) { s.IdlePause = &neg }, "idle_pause"},
		{"idle stop negative", func(s *Spec) { s.IdleStop = &neg }, "idle_stop"},
		{"max lifetime negative", func(s *Spec) { s.MaxLifetime = &neg }, "max_lifetime"},
		{"zero durations turn tiers off", func(s *Spec) { s.IdlePause, s.IdleStop, s.MaxLifetime = &zero, &zero, &zero }, ""},
		{"access bad", func(s *Spec) { s.Access = "secret" }, "access"},
		{"access private", func(s *Spec) { s.Access = AccessPrivate }, ""},
		// Bounds (issue: 2^44 MiB overflowed into "no limit").
		{"memory 2^44 MiB", func(s *Spec) { s.MemoryMB = 1 << 44 }, "memory_mb"},
		{"memory 95 TiB", func(s *Spec) { s.MemoryMB = 99999999 }, "memory_mb"},
		{"memory 1 TiB", func(s *Spec) { s.MemoryMB = MaxMemoryMB }, ""},
		{"pids huge", func(s *Spec) { s.PidsLimit = 1 << 40 }, "pids_limit"},
		{"idle pause a century", func(s *Spec) { d := 100 * 365 * 24 * time.Hour; s.IdlePause = &d }, "idle_pause"},
		// What Docker would refuse, refused before anything is made.
		{"image as a flag", func(s *Spec) { s.Image = "--help" }, "image"},
		{"image upper case", func(s *Spec) { s.Image = "Busybox" }, "image"},
		{"image with nbsp", func(s *Spec) { s.Image = "busy\u00a0box" }, "image"},
		{"image with registry port", func(s *Spec) { s.Image = "localhost:5000/app:1" }, ""},
		{"image with digest", func(s *Spec) { s.Image = "app@sha256:" + strings.Repeat("a", 64) }, ""},
		{"env name with newline", func(s *Spec) { s.Env = map[string]string{"A\nB": "x"} }, "env"},
		{"env name with cr", func(s *Spec) { s.Env = map[string]string{"A\rB": "x"} }, "env"},
		{"env value with nul", func(s *Spec) { s.Env = map[string]string{"A": "x\x00y"} }, "env"},
		{"env too big", func(s *Spec) { s.Env = map[string]string{"A": strings.Repeat("x", MaxEnvBytes)} }, "env"},
		{"cmd with nul", func(s *Spec) { s.Cmd = []string{"/app", "a\x00b"} }, "cmd"},
		{"workspace /proc", func(s *Spec) { s.WorkspacePath = "/proc" }, "workspace_path"},
		{"workspace below /sys", func(s *Spec) { s.WorkspacePath = "/sys/fs/cgroup" }, "workspace_path"},
		{"workspace /dev/shm", func(s *Spec) { s.WorkspacePath = "/dev/shm" }, "workspace_path"},
		{"workspace /etc", func(s *Spec) { s.WorkspacePath = "/etc/" }, "workspace_path"},
		{"workspace /usr", func(s *Spec) { s.WorkspacePath = "/usr" }, "workspace_path"},
		{"workspace /procfs is fine", func(s *Spec) { s.WorkspacePath = "/procfs" }, ""},
		{"workspace below /usr is fine", func(s *Spec) { s.WorkspacePath = "/usr/src/app" }, ""},
		{"too many labels", func(s *Spec) {
			s.Labels = map[string]string{}
			for i := range MaxLabels + 1 {
				s.Labels[strings.Repeat("k", i+1)] = "v"
			}
		}, "labels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSpec()
			tt.mutate(&s)
			err := NormalizeSpec(&s)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("NormalizeSpec: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q does not name %s", err, tt.wantErr)
			}
		})
	}
}

func portRange(n int) []int {
	ports := make([]int, n)
	for i := range ports {
		ports[i] = 8000 + i
	}
	return ports
}

func TestNormalizeSpecDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   Spec
		want Spec
	}{
		{
			name: "defaults filled",
			in:   Spec{Image: "  app:1 \n", Ports: []int{8080}},
			want: Spec{Image: "app:1", Ports: []int{8080}, PidsLimit: DefaultPidsLimit, WorkspacePath: DefaultWorkspacePath, ReadyMode: ReadyHTTP, Access: AccessPublic},
		},
		{
			name: "values kept",
			in:   Spec{Image: "app:1", Ports: []int{9000, 8080}, PidsLimit: 64, WorkspacePath: "/srv/data", ReadyMode: ReadyTCP, Access: AccessPrivate, MemoryMB: 256, CPUs: 1.5},
			want: Spec{Image: "app:1", Ports: []int{9000, 8080}, PidsLimit: 64, WorkspacePath: "/srv/data", ReadyMode: ReadyTCP, Access: AccessPrivate, MemoryMB: 256, CPUs: 1.5},
		},
		{
			name: "workspace cleaned",
			in:   Spec{Image: "app:1", Ports: []int{8080}, WorkspacePath: "/srv//data/../work/"},
			want: Spec{Image: "app:1", Ports: []int{8080}, PidsLimit: DefaultPidsLimit, WorkspacePath: "/srv/work", ReadyMode: ReadyHTTP, Access: AccessPublic},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in
			if err := NormalizeSpec(&got); err != nil {
				t.Fatal(err)
			}
			if got.Image != tt.want.Image || got.PidsLimit != tt.want.PidsLimit || got.WorkspacePath != tt.want.WorkspacePath ||
				got.ReadyMode != tt.want.ReadyMode || got.Access != tt.want.Access || got.MemoryMB != tt.want.MemoryMB ||
				got.CPUs != tt.want.CPUs || len(got.Ports) != len(tt.want.Ports) || got.Ports[0] != tt.want.Ports[0] {
				t.Fatalf("got %+v\nwant %+v", got, tt.want)
			}
			// Normalizing twice changes nothing.
			again := got
			if err := NormalizeSpec(&again); err != nil || again.WorkspacePath != got.WorkspacePath || again.Image != got.Image {
				t.Fatalf("second normalize: %+v, %v", again, err)
			}
		})
	}
}

func TestCheckSpecHostBounds(t *testing.T) {
	m := &Manager{cfg: Config{HostCPUs: 2, HostMemoryMB: 4096, DefaultMemoryMB: 512, AllowedImages: []string{"sandwake-*:*", "registry.example.com/previews/*"}}}
	tests := []struct {
		name    string
		mutate  func(s *Spec)
		wantErr string
		wantMem int64
	}{
		{"default memory applied", func(s *Spec) { s.Image = "sandwake-testapp:1" }, "", 512},
		{"own memory kept", func(s *Spec) { s.Image = "sandwake-testapp:1"; s.MemoryMB = 64 }, "", 64},
		{"cpus above the host", func(s *Spec) { s.Image = "sandwake-testapp:1"; s.CPUs = 1000 }, "cpus", 0},
		{"cpus of the host", func(s *Spec) { s.Image = "sandwake-testapp:1"; s.CPUs = 2 }, "", 512},
		{"memory above the host", func(s *Spec) { s.Image = "sandwake-testapp:1"; s.MemoryMB = 8192 }, "memory_mb", 0},
		{"image not allowed", func(s *Spec) { s.Image = "evil/miner:1" }, "not allowed", 0},
		{"image allowed by registry glob", func(s *Spec) { s.Image = "registry.example.com/previews/app:3" }, "", 512},
		{"image allowed without tag (latest)", func(s *Spec) { s.Image = "sandwake-demo" }, "", 512},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSpec()
			tt.mutate(&s)
			err := m.checkSpec(&s)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tt.wantErr != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tt.wantErr)
			case tt.wantErr == "" && s.MemoryMB != tt.wantMem:
				t.Fatalf("memory_mb = %d, want %d", s.MemoryMB, tt.wantMem)
			}
		})
	}
}

// TestCheckSpecIsolation: the gateway's isolation defaults fill what a spec
// leaves out (and the record keeps them); a spec's own values win; cap_add
// takes only the rest of Docker's default set; a runtime the engine lacks
// is refused naming those it has.
func TestCheckSpecIsolation(t *testing.T) {
	iso := Isolation{User: "1000:1000", ReadonlyRootfs: true, Runtime: "runc", Runtimes: []string{"runc", "runsc"}, CPUs: 0.5}
	m := &Manager{cfg: Config{HostCPUs: 2, Isolation: iso}}
	tests := []struct {
		name    string
		mutate  func(s *Spec)
		wantErr string
		check   func(t *testing.T, s Spec)
	}{
		{"defaults filled", func(s *Spec) {}, "", func(t *testing.T, s Spec) {
			if s.User != "1000:1000" || s.ReadonlyRootfs == nil || !*s.ReadonlyRootfs || s.Runtime != "runc" || s.CPUs != 0.5 || s.CapAdd != nil {
				t.Fatalf("got user %q readonly %v runtime %q cpus %g cap_add %v", s.User, s.ReadonlyRootfs, s.Runtime, s.CPUs, s.CapAdd)
			}
		}},
		{"own values kept", func(s *Spec) {
			off := false
			s.User, s.ReadonlyRootfs, s.Runtime, s.CPUs = "node", &off, "runsc", 1
		}, "", func(t *testing.T, s Spec) {
			if s.User != "node" || *s.ReadonlyRootfs || s.Runtime != "runsc" || s.CPUs != 1 {
				t.Fatalf("got user %q readonly %v runtime %q cpus %g", s.User, *s.ReadonlyRootfs, s.Runtime, s.CPUs)
			}
		}},
		{"cap_add normalised", func(s *Spec) { s.CapAdd = []string{"cap_net_raw", "SYS_CHROOT", "NET_RAW"} }, "", func(t *testing.T, s Spec) {
			if strings.Join(s.CapAdd, ",") != "NET_RAW,SYS_CHROOT" {
				t.Fatalf("cap_add %v, want [NET_RAW SYS_CHROOT]", s.CapAdd)
			}
		}},
		{"cap_add beyond the defaults", func(s *Spec) { s.CapAdd = []string{"NET_ADMIN"} }, "cap_add", nil},
		{"user with a space", func(s *Spec) { s.User = "a b" }, "user", nil},
		{"user with three parts", func(s *Spec) { s.User = "1:2:3" }, "user", nil},
		{"runtime not installed", func(s *Spec) { s.Runtime = "kata-runtime" }, "it has: runc, runsc", nil},
		{"runtime name with a slash", func(s *Spec) { s.Runtime = "../runc" }, "runtime", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSpec()
			s.Image = "sandwake-testapp:1"
			tt.mutate(&s)
			err := m.checkSpec(&s)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tt.wantErr != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tt.wantErr)
			case tt.check != nil:
				tt.check(t, s)
			}
		})
	}
}
