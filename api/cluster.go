package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/cluster/peer"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle"
)

// routed serves an operation on one sandbox where the sandbox lives: a
// sandbox the catalog puts on another node is handed to that node's API.
// Requests forwarded by a node are served here, never forwarded again.
func (api *Handler) routed(h func(http.ResponseWriter, *http.Request, *gateway.Gateway)) func(http.ResponseWriter, *http.Request, *gateway.Gateway) {
	return func(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
		if e.Cluster == nil || peer.Forwarded(r) {
			h(w, r, e)
			return
		}
		id := strings.ToLower(r.PathValue("id"))
		en, ok := e.Cluster.Lookup(id)
		if !ok || en.Node == e.Cluster.Self() {
			h(w, r, e)
			return
		}
		if _, err := e.Mgr.Get(id); err == nil {
			// This node holds the record: it answers, whatever the
			// catalog says (an entry moved or put back behind its back
			// is repaired by the publisher).
			h(w, r, e)
			return
		}
		if en.State == lifecycle.Killed && en.Reason == cluster.ReasonNodeRemoved && isDestroyOrPurge(r) {
			// Its node was removed for good: nobody can answer for it, so
			// destroying (or purging) it forgets its entry, and the id is
			// free again. The files went with the host.
			forgotten, err := e.Cluster.Forget(r.Context(), id)
			if err != nil {
				web.WriteError(w, http.StatusServiceUnavailable, "cluster_unavailable",
					fmt.Sprintf("sandbox %s of removed node %s could not be forgotten: %v", id, en.Node, err), peer.HostRetryAfter)
				return
			}
			if forgotten {
				if r.Method == http.MethodDelete {
					w.WriteHeader(http.StatusNoContent)
				} else {
					web.WriteJSON(w, http.StatusOK, client.PurgeResult{})
				}
				return
			}
		}
		e.Cluster.ForwardAPI(w, r, en.Node, fmt.Sprintf("sandbox %s lives on node %s", id, en.Node), principalOf(r).callerValue(), nil)
	}
}

// isDestroyOrPurge reports whether r is DELETE /v1/sandboxes/{id} or
// POST /v1/sandboxes/{id}/purge.
func isDestroyOrPurge(r *http.Request) bool {
	if r.Method == http.MethodDelete {
		return !strings.HasSuffix(r.URL.Path, "/tokens")
	}
	return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/purge")
}

// createInCluster serves POST /v1/sandboxes in cluster mode: the id is
// claimed cluster-wide in etcd before anything is created, and the sandbox
// placed on the least loaded node with room. A create forwarded by another
// node was placed there already: it is created here.
func (api *Handler) createInCluster(w http.ResponseWriter, r *http.Request, e *gateway.Gateway, body *createBody, spec lifecycle.Spec) {
	began := time.Now()
	c := e.Cluster.Cluster
	// A create from a template without an id takes the id of the pool
	// container it claims (or draws one on the node it is placed on), and
	// is placed where the template's pool has an idle container.
	pooled := body.Template != "" && body.ID == "" && body.Pool != lifecycle.PoolBypass
	if body.ID == "" && !pooled {
		body.ID = lifecycle.NewID(time.Now())
	}
	id := strings.ToLower(body.ID)
	if !pooled && !lifecycle.ValidID(id) {
		web.WriteError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("id %q must be 1-%d characters of [0-9a-z]", body.ID, lifecycle.MaxIDLen), 0)
		return
	}
	body.ID = id
	what := "sandbox " + id
	if pooled {
		what = "a sandbox of template " + body.Template
	}
	var tmpl *lifecycle.Spec
	if t, ok := e.Mgr.Template(body.Template); ok {
		tmpl = &t.Spec
	}
	mem := placementMemoryMB(&spec, tmpl, e.DefaultMemMB.Load())
	if !peer.Forwarded(r) {
		// A node that cannot be dialled (dead within its lease) got
		// nothing: the create is placed again without it.
		var unreachable []string
		for {
			template := ""
			if pooled {
				template = body.Template
			}
			node, err := c.PlaceFrom(template, mem, unreachable...)
			if err != nil {
				web.WriteEngineError(w, fmt.Errorf("placing %s: %w", what, err))
				return
			}
			if node.Name == c.Self() {
				break
			}
			b, err := json.Marshal(body)
			if err != nil {
				web.WriteError(w, http.StatusInternalServerError, "failed", "encoding the create for node "+node.Name+": "+err.Error(), 0)
				return
			}
			if !e.Cluster.ProxyAPI(w, r, node.Name, what+" was placed on node "+node.Name, principalOf(r).callerValue(), b, true) {
				return
			}
			e.Log.Warn("node did not answer a create placed on it; placing again without it",
				zap.String("sandbox", what), zap.String("node", node.Name))
			unreachable = append(unreachable, node.Name)
		}
	}
	// The id is reserved cluster-wide before anything is made: given, at
	// once; for a pooled create, once the claimed container (or the cold
	// create's draw) names it.
	reserve := func(id string) error {
		if err := c.Reserve(r.Context(), id, mem); err != nil {
			return fmt.Errorf("reserving sandbox id %s: %w", id, err)
		}
		return nil
	}
	req := lifecycle.CreateRequest{ID: id, Spec: spec, Template: body.Template, Pool: body.Pool, Tenant: principalOf(r).labels}
	if pooled {
		id = "" // until reserved
		req.Reserve = func(got string) error {
			if err := reserve(got); err != nil {
				return err
			}
			id = got
			return nil
		}
		// The id of a pool container whose claim failed is given back
		// at once (the container may go back to the pool).
		req.Release = func(got string) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.Release(ctx, got); err != nil {
				e.Log.Warn("releasing the id of a failed claim", zap.String("id", got), zap.Error(err))
			}
			if id == got {
				id = ""
			}
		}
	} else if err := reserve(id); err != nil {
		web.WriteEngineError(w, err)
		return
	}
	rec, pool, err := e.Mgr.CreatePooled(r.Context(), req)
	if err != nil && id == "" {
		web.WriteEngineError(w, err) // nothing was reserved
		return
	}
	if err != nil {
		// A create that left no record gives its id back; one that left a
		// failed record publishes it like any change.
		if _, gerr := e.Mgr.Get(id); errors.Is(gerr, lifecycle.ErrNotFound) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if rerr := c.Release(ctx, id); rerr != nil {
				e.Log.Warn("releasing the id of a failed create", zap.String("id", id), zap.Error(rerr))
			}
			cancel()
		} else {
			c.Changed(id)
		}
		web.WriteEngineError(w, err)
		return
	}
	writeCreated(w, e, &rec, body.Template, pool, began)
}

// listInCluster serves GET /v1/sandboxes in cluster mode: this node's
// records in full, the other nodes' sandboxes as the catalog shows them.
func (api *Handler) listInCluster(w http.ResponseWriter, r *http.Request, e *gateway.Gateway, q listQuery) {
	state := q.state
	recs, err := e.Mgr.List(state)
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	who := principalOf(r)
	out := make([]recordView, 0, len(recs))
	local := make(map[string]bool, len(recs))
	for i := range recs {
		local[recs[i].ID] = true
		if who.sees(recs[i].Spec.Labels) && lifecycle.HasLabels(recs[i].Spec.Labels, q.labels) {
			out = append(out, view(e, &recs[i]))
		}
	}
	self := e.Cluster.Self()
	for _, en := range e.Cluster.Entries() {
		if en.Node == self || local[en.ID] || (state != "" && en.State != state) || !who.sees(en.Labels) || !lifecycle.HasLabels(en.Labels, q.labels) {
			continue
		}
		out = append(out, entryView(e, &en))
	}
	next := ""
	if q.paged {
		// The catalog is in memory: the page is cut from the whole list,
		// in id order, as a single host's store walks it.
		slices.SortFunc(out, func(a, b recordView) int { return strings.Compare(a.ID, b.ID) })
		start, _ := slices.BinarySearchFunc(out, q.cursor, func(v recordView, c string) int { return strings.Compare(v.ID, c) })
		if start < len(out) && out[start].ID == q.cursor {
			start++
		}
		out = out[start:]
		if len(out) > q.limit {
			out = out[:q.limit]
			next = out[len(out)-1].ID
		}
	}
	web.WriteJSON(w, http.StatusOK, client.SandboxList{Sandboxes: out, Next: next})
}

// entryView renders another node's sandbox from its catalog entry: what
// the catalog knows (the owner's API has the rest).
func entryView(e *gateway.Gateway, en *cluster.Entry) recordView {
	s := e.Current.Load()
	v := recordView{
		ID: en.ID, State: string(en.State), Reason: en.Reason, EnvKeys: []string{}, Ports: en.Ports,
		URLs: make(map[string]string, len(en.Ports)), MemoryMB: en.MemoryMB, Labels: en.Labels,
		Access: en.Access, CreatedAt: en.CreatedAt, StateSince: en.UpdatedAt, Node: en.Node,
	}
	for _, p := range en.Ports {
		v.URLs[strconv.Itoa(p)] = s.PreviewURLOf(en.ID, p)
	}
	return v
}

// notClustered answers the cluster endpoints of a single host, and reports
// whether it did.
func notClustered(w http.ResponseWriter, e *gateway.Gateway) bool {
	if e.Cluster != nil {
		return false
	}
	web.WriteError(w, http.StatusNotFound, "not_clustered",
		"this gateway is a single host: nodes exist only with a cluster block in the sandwake options", 0)
	return true
}

// nodesView is the body of GET /v1/nodes.
type nodesView struct {
	Self  string             `json:"self"`
	Nodes []cluster.NodeInfo `json:"nodes"`
}

func (api *Handler) nodes(w http.ResponseWriter, _ *http.Request, e *gateway.Gateway) {
	if notClustered(w, e) {
		return
	}
	nodes := e.Cluster.Nodes()
	if nodes == nil {
		nodes = []cluster.NodeInfo{}
	}
	web.WriteJSON(w, http.StatusOK, nodesView{Self: e.Cluster.Self(), Nodes: nodes})
}

// drainNode serves POST /v1/nodes/{name}/drain {"draining": true|false}.
func (api *Handler) drainNode(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	if notClustered(w, e) {
		return
	}
	var body struct {
		Draining *bool `json:"draining"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Draining == nil {
		web.WriteError(w, http.StatusBadRequest, "invalid", `draining is required: {"draining": true} or {"draining": false}`, 0)
		return
	}
	name := r.PathValue("name")
	if err := e.Cluster.Drain(r.Context(), name, *body.Draining); err != nil {
		web.WriteEngineError(w, fmt.Errorf("draining node %s: %w", name, err))
		return
	}
	n, _ := e.Cluster.Node(name)
	n.Draining = *body.Draining // the registry may not have seen the mark yet
	web.WriteJSON(w, http.StatusOK, n)
}

// removeNode serves DELETE /v1/nodes/{name}: a node gone for good is
// forgotten and its sandboxes marked killed.
func (api *Handler) removeNode(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	if notClustered(w, e) {
		return
	}
	name := r.PathValue("name")
	if n, ok := e.Cluster.Node(name); ok && n.Live {
		web.WriteError(w, http.StatusConflict, "node_live",
			fmt.Sprintf("node %s holds its lease: stop it first (a live node cannot be removed)", name), 0)
		return
	}
	killed, err := e.Cluster.Remove(r.Context(), name)
	if err != nil {
		web.WriteEngineError(w, fmt.Errorf("removing node %s: %w", name, err))
		return
	}
	web.WriteJSON(w, http.StatusOK, map[string]any{"node": name, "removed": true, "killed": killed})
}

// clusterCheck is readyz's cluster check: "ok", or why etcd cannot be used;
// plaintext etcd and a node certificate about to expire are flagged
// without making the node unready.
func clusterCheck(e *gateway.Gateway) (string, bool) {
	if err := e.Cluster.Health(); err != nil {
		return err.Error(), false
	}
	var notes []string
	if e.Cluster.Plaintext {
		notes = append(notes, "etcd is plaintext (insecure_plaintext is set)")
	}
	if cr := e.Cluster.Peers.Current(); cr != nil {
		if left := time.Until(cr.Cert.Leaf.NotAfter); left < peer.CertRenewWarning {
			notes = append(notes, fmt.Sprintf("the node certificate expires in %s (issue a new one and reload)", left.Round(time.Minute)))
		}
	}
	if len(notes) > 0 {
		return "ok, but " + strings.Join(notes, "; "), true
	}
	return "ok", true
}

// placementMemoryMB is the memory a create is placed by: the app's and
// every service's (a group is placed whole), each the create's own, else
// its template's, else the gateway's default.
func placementMemoryMB(spec, tmpl *lifecycle.Spec, defMB int64) int64 {
	mem, services := spec.MemoryMB, spec.Services
	if tmpl != nil {
		if mem == 0 {
			mem = tmpl.MemoryMB
		}
		if len(services) == 0 { // as the create takes it (lifecycle's fromTemplate)
			services = tmpl.Services
		}
	}
	if mem == 0 {
		mem = defMB
	}
	for _, svc := range services {
		if svc.MemoryMB > 0 {
			mem += svc.MemoryMB
		} else {
			mem += defMB
		}
	}
	return mem
}
