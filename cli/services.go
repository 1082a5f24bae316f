package cli

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/sandwake/sandwake/client"
)

// This file holds create's --service flag and how a sandbox's services
// are printed.

// serviceKeys are the keys of a --service value after NAME=IMAGE, in the
// API's names (env.KEY=VALUE sets a variable).
var serviceKeys = []string{"ready", "memory_mb", "cpus", "disk_mb", "workspace_path", "depends_on", "cmd", "env.KEY"}

// parseServices parses create's --service values into the request's
// services.
func parseServices(values []string) (map[string]client.Service, error) {
	if len(values) == 0 {
		return nil, nil
	}
	out := make(map[string]client.Service, len(values))
	for _, v := range values {
		name, svc, err := parseService(v)
		if err != nil {
			return nil, err
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--service %s: given twice", name)
		}
		out[name] = svc
	}
	return out, nil
}

// parseService parses one --service value:
// NAME=IMAGE[,ready=tcp:5432][,memory_mb=256][,cpus=0.5][,disk_mb=500]
// [,workspace_path=/x][,depends_on=a+b][,cmd=prog arg…][,env.KEY=VALUE…].
// Keys take the API's names or their kebab-case (memory-mb).
func parseService(value string) (string, client.Service, error) {
	var svc client.Service
	parts := strings.Split(value, ",")
	name, image, ok := strings.Cut(parts[0], "=")
	if !ok || name == "" || image == "" {
		return "", svc, fmt.Errorf("--service %q: want NAME=IMAGE[,key=value…] (keys: %s)", value, strings.Join(serviceKeys, ", "))
	}
	svc.Image = image
	seen := map[string]bool{}
	for _, part := range parts[1:] {
		k, v, ok := strings.Cut(part, "=")
		if !ok || k == "" {
			return "", svc, fmt.Errorf("--service %s: %q is not key=value (keys: %s)", name, part, strings.Join(serviceKeys, ", "))
		}
		if env, isEnv := strings.CutPrefix(k, "env."); isEnv {
			if env == "" {
				return "", svc, fmt.Errorf("--service %s: %q: env.KEY=VALUE needs a KEY", name, part)
			}
			if _, dup := svc.Env[env]; dup {
				return "", svc, fmt.Errorf("--service %s: env.%s given twice", name, env)
			}
			if svc.Env == nil {
				svc.Env = map[string]string{}
			}
			svc.Env[env] = v
			continue
		}
		key := strings.ReplaceAll(k, "-", "_")
		if seen[key] {
			return "", svc, fmt.Errorf("--service %s: %s given twice", name, k)
		}
		seen[key] = true
		var err error
		switch key {
		case "ready":
			svc.Ready = v
		case "workspace_path":
			svc.WorkspacePath = v
		case "memory_mb", "disk_mb":
			var n int64
			if n, err = strconv.ParseInt(v, 10, 64); err != nil {
				return "", svc, fmt.Errorf("--service %s: %s %q is not a whole number of MiB", name, k, v)
			}
			*map[string]*int64{"memory_mb": &svc.MemoryMB, "disk_mb": &svc.DiskMB}[key] = n
		case "cpus":
			if svc.CPUs, err = strconv.ParseFloat(v, 64); err != nil {
				return "", svc, fmt.Errorf("--service %s: cpus %q is not a number of cores such as 1 or 0.5", name, v)
			}
		case "depends_on":
			for d := range strings.SplitSeq(v, "+") {
				if d == "" {
					return "", svc, fmt.Errorf("--service %s: depends_on %q: want names joined with + (cache+queue)", name, v)
				}
				svc.DependsOn = append(svc.DependsOn, d)
			}
		case "cmd":
			if svc.Cmd = strings.Fields(v); len(svc.Cmd) == 0 {
				return "", svc, fmt.Errorf("--service %s: cmd is empty", name)
			}
		default:
			return "", svc, fmt.Errorf("--service %s: unknown key %q (keys: %s)", name, k, strings.Join(serviceKeys, ", "))
		}
	}
	return name, svc, nil
}

// serviceLines are a sandbox's services as "service <name>" lines of
// writeRecord, by name: "running, 256 MiB, postgres:17, ready tcp:5432,
// after cache".
func serviceLines(services map[string]client.ServiceView) [][2]string {
	out := make([][2]string, 0, len(services))
	for _, name := range slices.Sorted(maps.Keys(services)) {
		s := services[name]
		parts := []string{orDash(s.State)}
		if s.MemoryMB > 0 {
			parts = append(parts, fmt.Sprintf("%d MiB", s.MemoryMB))
		}
		if s.DiskUsedMB > 0 {
			parts = append(parts, fmt.Sprintf("%d MiB written", s.DiskUsedMB))
		}
		parts = append(parts, s.Image)
		if s.Ready != "" {
			parts = append(parts, "ready "+s.Ready)
		}
		if len(s.DependsOn) > 0 {
			parts = append(parts, "after "+strings.Join(s.DependsOn, "+"))
		}
		out = append(out, [2]string{"service " + name, strings.Join(parts, ", ")})
	}
	return out
}
