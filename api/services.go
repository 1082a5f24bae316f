package api

import (
	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/lifecycle"
)

// This file holds the API's shapes of a sandbox's services: the
// containers beside the app that the lifecycle wakes, pauses and stops
// with it (lifecycle/services.go).

// serviceSpecs converts a create body's or a template's services to the
// engine's; the lifecycle checks them (a 400 naming services.<name>.<field>).
func serviceSpecs(in map[string]client.Service) map[string]lifecycle.Service {
	if in == nil {
		return nil
	}
	out := make(map[string]lifecycle.Service, len(in))
	for name, s := range in {
		// The wire type lists the engine's fields, in order: a field
		// added to one and not the other stops this from compiling.
		out[name] = lifecycle.Service(s)
	}
	return out
}

// servicesView renders a sandbox's services and, when it has any, the
// memory of the whole group. A member's state is what the engine showed
// while the group ran; a sandbox that is not running shows its own state
// for every member (the group is paused, stopped, … as one). diskUsed is
// each service's part of the disk watchdog's last measure, shown while the
// group is running or paused.
func servicesView(r *lifecycle.Record, diskUsed map[string]int64) (map[string]client.ServiceView, int64) {
	if len(r.Spec.Services) == 0 {
		return nil, 0
	}
	out := serviceViews(r.Spec.Services)
	resident := r.State == lifecycle.Running || r.State == lifecycle.Paused
	for name, v := range out {
		v.State = string(r.State)
		if st, ok := r.ServiceStates[name]; ok && r.State == lifecycle.Running {
			v.State = string(st)
		}
		if used, ok := diskUsed[name]; ok && resident {
			v.DiskUsedMB = used >> 20
		}
		out[name] = v
	}
	return out, r.Spec.GroupMemoryMB()
}

// serviceViews renders services without a state (a template's).
func serviceViews(services map[string]lifecycle.Service) map[string]client.ServiceView {
	if len(services) == 0 {
		return nil
	}
	out := make(map[string]client.ServiceView, len(services))
	for name, s := range services {
		out[name] = client.ServiceView{MemoryMB: s.MemoryMB, Image: s.Image, Ready: s.Ready, DependsOn: s.DependsOn}
	}
	return out
}
