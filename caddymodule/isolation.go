package caddymodule

import (
	"fmt"
	"strings"

	"github.com/sandwake/sandwake/lifecycle"
)

// maxNofile bounds nofile: the kernel's fs.nr_open default.
const maxNofile = 1 << 20

// validateIsolation checks the container options (user, runtime,
// default_cpus, nofile, tmp_mb) the way a spec's are checked.
func (a *App) validateIsolation() error {
	probe := lifecycle.Spec{User: a.User, Runtime: a.Runtime}
	if err := lifecycle.CheckIsolation(&probe); err != nil {
		return fmt.Errorf("sandwake: %s", strings.TrimPrefix(err.Error(), lifecycle.ErrInvalid.Error()+": "))
	}
	if !(a.DefaultCPUs >= 0 && a.DefaultCPUs <= lifecycle.MaxCPUs) {
		return fmt.Errorf("sandwake: default_cpus %g is out of range (0-%d)", a.DefaultCPUs, lifecycle.MaxCPUs)
	}
	if a.Nofile < 0 || a.Nofile > maxNofile {
		return fmt.Errorf("sandwake: nofile %d is out of range (1-%d)", a.Nofile, maxNofile)
	}
	if a.TmpMB < 0 || a.TmpMB > lifecycle.MaxMemoryMB {
		return fmt.Errorf("sandwake: tmp_mb %d is out of range (1-%d)", a.TmpMB, lifecycle.MaxMemoryMB)
	}
	return nil
}
