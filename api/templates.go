package api

import (
	"maps"
	"net/http"
	"slices"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle"
)

// templates answers GET /v1/templates: every template with its pool.
func (api *Handler) templates(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	sts := e.Mgr.Templates()
	out := client.TemplateList{Templates: make([]client.Template, 0, len(sts))}
	bound := principalOf(r).bound()
	for i := range sts {
		v := templateView(&sts[i])
		if bound {
			v.Pool = nil // the whole gateway's figures: not a tenant's to see
		}
		out.Templates = append(out.Templates, v)
	}
	web.WriteJSON(w, http.StatusOK, out)
}

func templateView(st *lifecycle.TemplateStatus) client.Template {
	t := &st.Template
	v := client.Template{
		Name: t.Name, Image: t.Spec.Image, Cmd: t.Spec.Cmd, EnvKeys: slices.Sorted(maps.Keys(t.Spec.Env)), Ports: t.Spec.Ports,
		MemoryMB: t.Spec.MemoryMB, CPUs: t.Spec.CPUs, WorkspacePath: t.Spec.WorkspacePath, ReadyPath: t.Spec.ReadyPath,
		IdlePause: optDuration(t.Spec.IdlePause), IdleStop: optDuration(t.Spec.IdleStop), MaxLifetime: optDuration(t.Spec.MaxLifetime),
		Labels: t.Spec.Labels, Access: t.Spec.Access, PublicCard: t.Spec.PublicCard, Activity: t.Spec.Activity, Services: serviceViews(t.Spec.Services),
		Pool: &client.PoolStatus{
			Idle: st.Idle, Filling: st.Filling, MinIdle: t.Pool.MinIdle, MaxIdle: t.Pool.MaxIdle, State: t.Pool.State,
			Hits: st.Hits, MissReasons: st.Misses, Refills: st.Refills, LastError: st.LastError,
		},
	}
	if eg := t.Spec.Egress; eg.Policy != "" || eg.Allow != nil || eg.Deny != nil {
		v.Egress = &client.Egress{Policy: eg.Policy, Allow: eg.Allow, Deny: eg.Deny}
	}
	if v.EnvKeys == nil {
		v.EnvKeys = []string{}
	}
	if t.Pool.MaxAge > 0 {
		v.Pool.MaxAge = t.Pool.MaxAge.String()
	}
	for _, n := range st.Misses {
		v.Pool.Misses += n
	}
	if len(v.Pool.MissReasons) == 0 {
		v.Pool.MissReasons = nil
	}
	return v
}
