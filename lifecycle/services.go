package lifecycle

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
)

// This file holds a sandbox's services: containers beside the app (a
// database, a cache, a worker) that share its network namespace and
// address and are woken, paused, stopped, pooled and destroyed with it.

// Service is one member of a sandbox's group beside the app.
type Service struct {
	Image string            `json:"image"`
	Cmd   []string          `json:"cmd,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	// MemoryMB, CPUs and DiskMB as a sandbox's; MemoryMB 0 takes the
	// gateway's default_memory, and the group's memory is the sum.
	MemoryMB int64   `json:"memory_mb,omitempty"`
	CPUs     float64 `json:"cpus,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	// Ready is "tcp:<port>" or "http:<port><path>", probed inside the
	// group's network namespace (a service listening on 127.0.0.1 only is
	// found); "" is ready once started.
	Ready string `json:"ready,omitempty"`
	// WorkspacePath is where the service's own volume is mounted.
	// Default: /workspace.
	WorkspacePath string `json:"workspace_path,omitempty"`
	// DependsOn are services started (and ready) before this one.
	DependsOn []string `json:"depends_on,omitempty"`
}

// ServiceError is a service that did not start or become ready: the
// create or wake of its group fails with it, naming the service.
type ServiceError struct {
	Service string
	Err     error
}

func (e *ServiceError) Error() string { return "service " + e.Service + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *ServiceError) Unwrap() error { return e.Err }

// MaxServices bounds a sandbox's services.
const MaxServices = 8

// ReservedServiceNames may not name a service: "app" is the sandbox's own
// container and "net" the one that holds the group's network namespace.
var ReservedServiceNames = []string{"app", "net"}

// ValidServiceName reports whether n can name a service: 1-20 characters
// of [a-z0-9-], starting with a letter, not reserved.
func ValidServiceName(n string) bool {
	if len(n) == 0 || len(n) > 20 || n[0] < 'a' || n[0] > 'z' || slices.Contains(ReservedServiceNames, n) || strings.HasSuffix(n, "-") {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// ParseReady parses a service's ready probe: "tcp:<port>" or
// "http:<port><path>" (path "/" when empty). An empty probe is none.
func ParseReady(s string) (mode string, port int, path string, err error) {
	if s == "" {
		return "", 0, "", nil
	}
	mode, rest, ok := strings.Cut(s, ":")
	if !ok || (mode != ReadyTCP && mode != ReadyHTTP) {
		return "", 0, "", fmt.Errorf("%q: want tcp:<port> or http:<port>[/path]", s)
	}
	digits := rest
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		digits, path = rest[:i], rest[i:]
	}
	if mode == ReadyTCP && path != "" {
		return "", 0, "", fmt.Errorf("%q: a tcp probe has no path", s)
	}
	port, err = strconv.Atoi(digits)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, "", fmt.Errorf("%q: %q is not a port (1-65535)", s, digits)
	}
	if mode == ReadyHTTP && path == "" {
		path = "/"
	}
	return mode, port, path, nil
}

// ServiceOrder is the order services start in: each after those it
// depends on, otherwise by name. It fails on an unknown dependency or a
// cycle, naming them.
func ServiceOrder(services map[string]Service) ([]string, error) {
	names := slices.Sorted(maps.Keys(services))
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(n string, path []string) error
	visit = func(n string, path []string) error {
		switch state[n] {
		case 1:
			return fmt.Errorf("services depend on each other in a cycle: %s", strings.Join(append(path, n), " → "))
		case 2:
			return nil
		}
		state[n] = 1
		deps := slices.Clone(services[n].DependsOn)
		slices.Sort(deps)
		for _, d := range deps {
			if _, ok := services[d]; !ok {
				return fmt.Errorf("service %s depends on %q, which is not one of its services", n, d)
			}
			if err := visit(d, append(path, n)); err != nil {
				return err
			}
		}
		state[n] = 2
		order = append(order, n)
		return nil
	}
	for _, n := range names {
		if err := visit(n, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// GroupMemoryMB is the memory the sandbox's containers may use together:
// the app's and its services' limits.
func (s *Spec) GroupMemoryMB() int64 {
	n := s.MemoryMB
	for _, svc := range s.Services {
		n += svc.MemoryMB
	}
	return n
}

// CheckServices refuses what is wrong with services whatever the
// gateway's settings: their count, a name, a missing image, a ready probe,
// a negative or out-of-range limit, a workspace path, an env name,
// depends_on. The config checks a template's with it when it is loaded;
// every create checks them again with the settings (normalizeServices).
// The error wraps ErrInvalid and names services.<name>.<field>.
func CheckServices(services map[string]Service) error {
	if len(services) > MaxServices {
		return invalid("services: %d, at most %d", len(services), MaxServices)
	}
	for _, name := range slices.Sorted(maps.Keys(services)) {
		svc := services[name]
		if !ValidServiceName(name) {
			return invalid("services: %q is not a service name (1-20 of a-z, 0-9 and '-', starting with a letter; not %s)", name, strings.Join(ReservedServiceNames, " or "))
		}
		if svc.Image == "" {
			return invalid("services.%s.image: required", name)
		}
		if _, _, _, err := ParseReady(svc.Ready); err != nil {
			return invalid("services.%s.ready: %v", name, err)
		}
		if svc.MemoryMB < 0 || (svc.MemoryMB > 0 && svc.MemoryMB < MinMemoryMB) || svc.MemoryMB > MaxMemoryMB {
			return invalid("services.%s.memory_mb: %d is outside %d..%d", name, svc.MemoryMB, MinMemoryMB, MaxMemoryMB)
		}
		if svc.CPUs < 0 {
			return invalid("services.%s.cpus: %g is negative", name, svc.CPUs)
		}
		if svc.DiskMB < 0 {
			return invalid("services.%s.disk_mb: %d is negative", name, svc.DiskMB)
		}
		if p := svc.WorkspacePath; p != "" {
			if _, err := checkWorkspacePath("services."+name+".workspace_path", p); err != nil {
				return err
			}
		}
		for k := range svc.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				return invalid("services.%s.env: %q is not a variable name", name, k)
			}
		}
	}
	if _, err := ServiceOrder(services); err != nil {
		return invalid("services: %v", err)
	}
	return nil
}

// normalizeServices checks a spec's services against the gateway's
// settings too and fills their defaults.
func normalizeServices(spec *Spec, cfg *Config) error {
	if err := CheckServices(spec.Services); err != nil {
		return err
	}
	// The map may be a template's, shared with its readers: defaults go
	// into a copy.
	spec.Services = maps.Clone(spec.Services)
	for name, svc := range spec.Services {
		if len(cfg.AllowedImages) > 0 && !ImageAllowed(cfg.AllowedImages, svc.Image) {
			return invalid("services.%s.image: %q is not allowed here (allowed_images: %s)", name, svc.Image, strings.Join(cfg.AllowedImages, " "))
		}
		if cfg.HostCPUs > 0 && svc.CPUs > float64(cfg.HostCPUs) {
			return invalid("services.%s.cpus: %g is outside 0..%d", name, svc.CPUs, cfg.HostCPUs)
		}
		if svc.MemoryMB == 0 {
			svc.MemoryMB = cfg.DefaultMemoryMB
		}
		if svc.WorkspacePath == "" {
			svc.WorkspacePath = "/workspace"
		}
		svc.WorkspacePath = path.Clean(svc.WorkspacePath) // checked above
		spec.Services[name] = svc
	}
	if cfg.HostMemoryMB > 0 && spec.GroupMemoryMB() > cfg.HostMemoryMB {
		return invalid("memory_mb: the group's %d MiB (app and services) is more than the host's %d MiB", spec.GroupMemoryMB(), cfg.HostMemoryMB)
	}
	return nil
}

// ResidentServices counts the services of the running and paused groups,
// by their sandbox's state (a group runs or pauses as one): the service
// containers that hold memory beside the apps max_resident counts. It
// reads the resident sandboxes' records, not the whole store.
func (m *Manager) ResidentServices() (map[State]int, error) {
	recs, err := m.residentRecords(func(r *Record) bool { return len(r.Spec.Services) > 0 })
	if err != nil {
		return nil, err
	}
	out := map[State]int{Running: 0, Paused: 0}
	for i := range recs {
		if Resident(recs[i].State) {
			out[recs[i].State] += len(recs[i].Spec.Services)
		}
	}
	return out, nil
}
