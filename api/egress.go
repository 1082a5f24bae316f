package api

import (
	"net/http"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle"
)

// This file holds the routes of a sandbox's egress log and of
// learn-then-lock: GET /v1/sandboxes/{id}/egress and
// POST /v1/sandboxes/{id}/egress/lock. The policy itself is changed by
// PATCH /v1/sandboxes/{id}.

// egressLog answers GET /v1/sandboxes/{id}/egress: what the sandbox tried
// outbound and, while it learns, the allow list a lock would make.
func (api *Handler) egressLog(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	rec, err := e.Mgr.Get(id)
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	l, err := e.Mgr.EgressLog(id)
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	web.WriteJSON(w, http.StatusOK, egressLogView(&rec, l))
}

// egressLogView renders a sandbox's egress log for the API: empty lists
// as [], never null, and the learned list under the learn policy only
// (what the record kept across restarts and what the log shows).
func egressLogView(rec *lifecycle.Record, l lifecycle.EgressLog) client.EgressLog {
	v := client.EgressLog{
		ID: rec.ID, Policy: rec.Spec.Egress.Policy,
		Decisions: make([]client.EgressDecision, 0, len(l.Decisions)),
		Lookups:   make([]client.EgressLookup, 0, len(l.Lookups)),
	}
	for _, d := range l.Decisions {
		v.Decisions = append(v.Decisions, client.EgressDecision{
			First: d.First, Last: d.Last, Addr: d.Addr.String(), Port: int(d.Port), Proto: d.Proto,
			Name: d.Name, Allowed: d.Allowed, Count: d.Count,
		})
	}
	for _, lk := range l.Lookups {
		out := client.EgressLookup{Name: lk.Name, Allowed: lk.Allowed, Count: lk.Count, Last: lk.Last}
		for _, a := range lk.Addrs {
			out.Addrs = append(out.Addrs, a.String())
		}
		v.Lookups = append(v.Lookups, out)
	}
	if v.Policy == lifecycle.EgressLearn {
		v.Learned = lifecycle.LockList(rec, l)
	}
	return v
}

// lockEgress answers POST /v1/sandboxes/{id}/egress/lock: the sandbox's
// learned destinations become its allow list under none (409 when it is
// not learning).
func (api *Handler) lockEgress(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	api.recordOp(w, r, e, e.Mgr.LockEgress)
}
