package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/cluster/peer"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle"
)

// maxBodyBytes bounds API request bodies.
const maxBodyBytes = 1 << 20

// Config is how the management API is configured (the sandwake_api
// handler's options).
type Config struct {
	// Token is the bearer token clients must send. Placeholders such as
	// {env.SANDWAKE_API_TOKEN} are replaced when the handler is made.
	// Required unless InsecureNoAuth is set.
	Token string `json:"token,omitempty"`
	// Tokens are more tokens, each with a scope (read, operate, admin)
	// and optionally labels binding it to one tenant's sandboxes. Token,
	// when set, is one more of scope admin.
	Tokens []TokenConfig `json:"tokens,omitempty"`
	// InsecureNoAuth serves the API without a token. Only for an API bound
	// to a trusted address.
	InsecureNoAuth bool `json:"insecure_no_auth,omitempty"`
}

// Validate refuses an API without authentication unless that is explicit.
func (c *Config) Validate() error {
	if c.Token == "" && len(c.Tokens) == 0 && !c.InsecureNoAuth {
		return errors.New("sandwake_api: set a token, or write insecure_no_auth to serve the API without one")
	}
	return nil
}

// Handler is the management REST API and its dashboard. Every route but
// /v1/healthz and /v1/readyz needs "Authorization: Bearer <token>".
type Handler struct {
	Config
	gateway func() *gateway.Gateway
	tokens  []apiToken
	mux     *http.ServeMux
	logger  *zap.Logger
	// stopping is closed when the server the API serves in shuts down:
	// its event streams end (see Shutdown).
	stopping chan struct{}
	stopOnce sync.Once
}

// New is the API over the gateway gw returns (nil before it starts: calls
// answer 503 until then), with cfg's tokens.
func New(cfg Config, gw func() *gateway.Gateway, logger *zap.Logger) (*Handler, error) {
	api := &Handler{Config: cfg, gateway: gw, logger: logger, stopping: make(chan struct{})}
	if err := api.provisionTokens(); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/healthz", api.healthz)
	mux.HandleFunc("GET /v1/readyz", api.readyz)
	read, operate, admin := ScopeRead, ScopeOperate, ScopeAdmin
	mux.HandleFunc("GET /v1/whoami", api.authed(read, api.whoami))
	mux.HandleFunc("POST /v1/sandboxes", api.authed(admin, api.create))
	mux.HandleFunc("GET /v1/sandboxes", api.authed(read, api.list))
	mux.HandleFunc("GET /v1/sandboxes/{id}", api.authed(read, api.routed(api.get)))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", api.authed(admin, api.routed(api.destroy)))
	mux.HandleFunc("POST /v1/sandboxes/{id}/wake", api.authed(operate, api.routed(api.wake)))
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", api.authed(operate, api.routed(api.pause)))
	mux.HandleFunc("POST /v1/sandboxes/{id}/stop", api.authed(operate, api.routed(api.stop)))
	mux.HandleFunc("POST /v1/sandboxes/{id}/keepalive", api.authed(operate, api.routed(api.keepalive)))
	mux.HandleFunc("POST /v1/sandboxes/{id}/purge", api.authed(admin, api.routed(api.purge)))
	mux.HandleFunc("GET /v1/sandboxes/{id}/history", api.authed(read, api.routed(api.history)))
	mux.HandleFunc("GET /v1/events", api.authed(read, api.events))
	mux.HandleFunc("PATCH /v1/sandboxes/{id}", api.authed(admin, api.routed(api.patch)))
	mux.HandleFunc("GET /v1/sandboxes/{id}/egress", api.authed(read, api.routed(api.egressLog)))
	mux.HandleFunc("POST /v1/sandboxes/{id}/egress/lock", api.authed(admin, api.routed(api.lockEgress)))
	mux.HandleFunc("POST /v1/sandboxes/{id}/tokens", api.authed(operate, api.routed(api.createToken)))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/tokens", api.authed(operate, api.routed(api.revokeTokens)))
	mux.HandleFunc("GET /v1/templates", api.authed(read, api.templates))
	mux.HandleFunc("GET /v1/nodes", api.authed(read, api.nodes))
	mux.HandleFunc("POST /v1/nodes/{name}/drain", api.authed(admin, api.unbound(api.drainNode)))
	mux.HandleFunc("DELETE /v1/nodes/{name}", api.authed(admin, api.unbound(api.removeNode)))
	mux.HandleFunc("GET /{$}", serveDashboard)
	mux.HandleFunc("GET /index.html", serveDashboard)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		web.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no API route %s %s", r.Method, r.URL.Path), 0)
	})
	api.mux = mux
	return api, nil
}

// Shutdown ends the API's event streams (GET /v1/events): the server it
// serves in is shutting down (a reload or a stop), and a stream must not
// hold that server's shutdown. Clients resume on the server that follows
// with Last-Event-ID.
func (api *Handler) Shutdown() { api.stopOnce.Do(func() { close(api.stopping) }) }

// ServeHTTP answers every request it is given.
func (api *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	api.mux.ServeHTTP(w, r)
}

// authed wraps a handler with the bearer-token check (a token of scope
// need at least), the engine lookup, and, for a token bound to labels, the
// check that the sandbox in the path is one it sees.
func (api *Handler) authed(need Scope, h func(http.ResponseWriter, *http.Request, *gateway.Gateway)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// A call another node forwarded (its certificate and signature
		// verified on the peer listener) carries no token but its caller,
		// signed by that node: it is decided here as that caller, against
		// this node's records.
		who := everyone
		from := peer.Of(r)
		switch {
		case from != "":
			var err error
			if who, err = forwardedCaller(r, from); err != nil {
				web.WriteError(w, http.StatusForbidden, "forbidden", err.Error(), 0)
				return
			}
		case !api.InsecureNoAuth:
			if who = api.caller(r); who == nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sandwake"`)
				web.WriteError(w, http.StatusUnauthorized, "unauthorized", unauthorizedMessage(r), 0)
				return
			}
		}
		if who.scope < need {
			writeForbidden(w, r, who, need)
			return
		}
		if who != everyone {
			r = withPrincipal(r, who)
		}
		e := api.gateway()
		if e == nil || !e.Ready.Load() {
			web.WriteError(w, http.StatusServiceUnavailable, "unavailable", "sandwake is starting", 1)
			return
		}
		if !peer.CheckForward(w, r, e.Cluster) {
			return
		}
		if id := strings.ToLower(r.PathValue("id")); id != "" && who.bound() && !visible(e, id, who, from != "") {
			// Another tenant's sandbox is answered as an unknown one.
			web.WriteEngineError(w, fmt.Errorf("sandbox %s: %w", id, lifecycle.ErrNotFound))
			return
		}
		h(w, r, e)
	}
}

// tokenOK reports whether r carries one of the API's tokens (any scope).
func (api *Handler) tokenOK(r *http.Request) bool { return api.caller(r) != nil }

func (api *Handler) healthz(w http.ResponseWriter, _ *http.Request) {
	web.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers whether the gateway can serve. To a caller without a
// token (of any scope) it names each check with ok or fail only: the
// details (storage path, etcd addresses, Docker's error texts) are for the
// operator. ?exclude=name (repeated, or names joined by commas) still
// runs and reports those checks but does not count them, as the
// Kubernetes API server's own /readyz does: a replica's readiness probe
// leaves out the checks an outage of the API server fails on every
// replica at once (deploy/kubernetes).
func (api *Handler) readyz(w http.ResponseWriter, r *http.Request) {
	e := api.gateway()
	// The container engine's check is named after it.
	engine := e.EngineName()
	checks := map[string]string{"store": "ok", engine: "ok", "boot_reconcile": "ok"}
	failed := map[string]bool{}
	fail := func(name, detail string) { checks[name], failed[name] = detail, true }
	if e == nil || !e.Ready.Load() {
		fail("store", "not started")
		fail(engine, "not started")
		fail("boot_reconcile", "not done")
	} else {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := e.Mgr.Ping(ctx); err != nil {
			fail(engine, err.Error())
		} else if open, until := e.Mgr.BreakerOpen(); open {
			fail(engine, "circuit open until "+until.UTC().Format(time.RFC3339))
		}
		if e.Mgr.LastReconcile().IsZero() {
			fail("boot_reconcile", "not done ("+engine+" unreachable at start?)")
		}
		if err := e.Mgr.CheckStore(); err != nil {
			fail("store", err.Error())
		} else if e.StoreWarning != "" {
			fail("store", e.StoreWarning)
		}
		if e.Cluster != nil {
			detail, ok := clusterCheck(e)
			if checks["cluster"] = detail; !ok {
				fail("cluster", detail)
			}
		}
		detail, ok := gateway.EgressCheck(ctx, e)
		if checks["egress"] = detail; !ok {
			fail("egress", detail)
		}
		checks["isolation"] = e.Isolation.Check()
		// How sandboxes are reached, and why: information, never a
		// failure (published works wherever direct cannot).
		checks["upstreams"] = e.Upstreams + ": " + e.UpstreamsWhy
	}
	excluded, err := readyzExclude(r.URL.Query()["exclude"], checks)
	if err != nil {
		web.WriteError(w, http.StatusBadRequest, "invalid", err.Error(), 0)
		return
	}
	ready := true
	for name := range failed {
		if !excluded[name] {
			ready = false
		}
	}
	status := http.StatusOK
	if !ready {
		status = http.StatusServiceUnavailable
	}
	out := map[string]any{"ready": ready, "checks": checks}
	if len(excluded) > 0 {
		out["excluded"] = slices.Sorted(maps.Keys(excluded))
	}
	if !api.InsecureNoAuth && peer.Of(r) == "" && !api.tokenOK(r) {
		for name := range checks {
			checks[name] = "ok"
			if failed[name] {
				checks[name] = "fail"
			}
		}
		web.WriteJSON(w, status, out)
		return
	}
	if e != nil {
		out["instance"] = e.Instance
		out["node"] = e.NodeName()
		if at := e.Mgr.LastReconcile(); !at.IsZero() {
			out["last_reconcile"] = at.UTC().Format(time.RFC3339Nano)
		}
	}
	web.WriteJSON(w, status, out)
}

// readyzExclude reads readyz's exclude values (each a name, or names
// joined by commas) against the checks run; a name that is none is an
// error naming them.
func readyzExclude(values []string, checks map[string]string) (map[string]bool, error) {
	var out map[string]bool
	for _, v := range values {
		for name := range strings.SplitSeq(v, ",") {
			name = strings.TrimSpace(name)
			if name == "" {
				continue
			}
			if _, ok := checks[name]; !ok {
				return nil, fmt.Errorf("readyz: exclude=%s names no check (checks: %s)", name, strings.Join(slices.Sorted(maps.Keys(checks)), ", "))
			}
			if out == nil {
				out = map[string]bool{}
			}
			out[name] = true
		}
	}
	return out, nil
}

// decodeBody decodes a JSON object body into v strictly: unknown fields,
// keys given twice (see duplicateKey), trailing data and bodies over
// maxBodyBytes are errors with a clear message (see bodyErrorMessage).
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if tooBig, ok := errors.AsType[*http.MaxBytesError](err); ok {
		web.WriteError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body is over %d bytes", tooBig.Limit), 0)
		return false
	}
	if err != nil {
		web.WriteError(w, http.StatusBadRequest, "invalid", "reading the request body: "+err.Error(), 0)
		return false
	}
	if path, key, dup := duplicateKey(body, reflect.TypeOf(v)); dup {
		web.WriteError(w, http.StatusBadRequest, "invalid", duplicateKeyWords(path, key), 0)
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil {
		// More() would miss a stray } or ]: only end of input may follow.
		off := dec.InputOffset()
		if _, terr := dec.Token(); terr != io.EOF {
			off += int64(len(body[off:]) - len(bytes.TrimLeft(body[off:], " \t\r\n")))
			web.WriteError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("request body has more after the JSON object, at byte %d: send one object", off+1), 0)
			return false
		}
		return true
	}
	if errors.Is(err, io.EOF) {
		web.WriteError(w, http.StatusBadRequest, "invalid", "request body is empty: a JSON object is required", 0)
		return false
	}
	web.WriteError(w, http.StatusBadRequest, "invalid", bodyErrorMessage(body, v, err), 0)
	return false
}

// parseOptionalDuration parses a Go duration string field.
func parseOptionalDuration(name string, s *string) (*time.Duration, error) {
	if s == nil {
		return nil, nil
	}
	d, err := caddy.ParseDuration(*s)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %q is not a duration like \"90s\" or \"30m\"", lifecycle.ErrInvalid, name, *s)
	}
	return &d, nil
}

func (b *createBody) spec() (lifecycle.Spec, error) {
	spec := lifecycle.Spec{
		Image: b.Image, Cmd: b.Cmd, Env: b.Env, Ports: b.Ports, MemoryMB: b.MemoryMB, CPUs: b.CPUs,
		WorkspacePath: b.WorkspacePath, ReadyPath: b.ReadyPath, ReadyMode: b.ReadyMode, Labels: b.Labels, Access: b.Access, PublicCard: b.PublicCard,
		User: b.User, ReadonlyRootfs: b.ReadonlyRootfs, CapAdd: b.CapAdd, Runtime: b.Runtime, DiskMB: b.DiskMB,
		Activity: b.Activity,
	}
	if b.Egress != nil {
		spec.Egress = lifecycle.Egress{Policy: b.Egress.Policy, Allow: b.Egress.Allow, Deny: b.Egress.Deny}
	}
	spec.Services = serviceSpecs(b.Services)
	var err error
	if spec.IdlePause, err = parseOptionalDuration("idle_pause", b.IdlePause); err != nil {
		return spec, err
	}
	if spec.IdleStop, err = parseOptionalDuration("idle_stop", b.IdleStop); err != nil {
		return spec, err
	}
	if spec.MaxLifetime, err = parseOptionalDuration("max_lifetime", b.MaxLifetime); err != nil {
		return spec, err
	}
	return spec, nil
}

func (api *Handler) create(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	var body createBody
	if !decodeBody(w, r, &body) {
		return
	}
	if who := principalOf(r); who.bound() {
		// A tenant's token stamps its labels on what it creates; it may
		// not claim other values for them.
		for k, v := range who.labels {
			if got, ok := body.Labels[k]; ok && got != v {
				web.WriteError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("labels: %s=%s is not this token's (%s): it creates sandboxes labelled %s only", k, got, who.name, labelList(who.labels)), 0)
				return
			}
		}
		body.Labels = maps.Clone(body.Labels)
		if body.Labels == nil {
			body.Labels = map[string]string{}
		}
		maps.Copy(body.Labels, who.labels)
	}
	spec, err := body.spec()
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	if e.Cluster != nil {
		api.createInCluster(w, r, e, &body, spec)
		return
	}
	began := time.Now()
	rec, pool, err := e.Mgr.CreatePooled(r.Context(), lifecycle.CreateRequest{ID: body.ID, Spec: spec, Template: body.Template, Pool: body.Pool, Tenant: principalOf(r).labels})
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	writeCreated(w, e, &rec, body.Template, pool, began)
}

// writeCreated answers a create that began at began: 201 with the
// record, the pool outcome of a create from a template, and where the
// time went in Server-Timing (create;dur, pool;desc), as a wake's held
// request is told.
func writeCreated(w http.ResponseWriter, e *gateway.Gateway, rec *lifecycle.Record, template string, pool lifecycle.PoolOutcome, began time.Time) {
	v := view(e, rec)
	timing := "create;dur=" + strconv.FormatFloat(float64(time.Since(began).Microseconds())/1000, 'f', 1, 64)
	if template != "" {
		v.Pool = &client.PoolOutcome{Hit: pool.Hit, Reason: pool.Reason}
		if pool.Hit {
			timing += `, pool;desc="hit"`
		} else {
			timing += `, pool;desc="miss ` + pool.Reason + `"`
		}
	}
	w.Header().Set("Server-Timing", timing)
	web.WriteJSON(w, http.StatusCreated, v)
}

func (api *Handler) list(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	q, err := parseListQuery(r)
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	if e.Cluster != nil {
		api.listInCluster(w, r, e, q)
		return
	}
	who := principalOf(r)
	if q.paged {
		recs, next, err := e.Mgr.ListPage(lifecycle.PageOptions{After: q.cursor, Limit: q.limit, State: q.state, Labels: q.labels,
			Keep: func(rec *lifecycle.Record) bool { return who.sees(rec.Spec.Labels) }})
		if err != nil {
			web.WriteEngineError(w, err)
			return
		}
		out := make([]recordView, len(recs))
		for i := range recs {
			out[i] = view(e, &recs[i])
		}
		page := client.SandboxList{Sandboxes: out, Next: next}
		if !who.bound() {
			// The engine's in-memory counts: what a page cannot tell.
			page.Counts = map[string]int{}
			for s, n := range e.Mgr.Counts() {
				page.Counts[string(s)] = n
			}
		}
		web.WriteJSON(w, http.StatusOK, page)
		return
	}
	recs, err := e.Mgr.List(q.state)
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	out := make([]recordView, 0, len(recs))
	for i := range recs {
		if who.sees(recs[i].Spec.Labels) && lifecycle.HasLabels(recs[i].Spec.Labels, q.labels) {
			out = append(out, view(e, &recs[i]))
		}
	}
	web.WriteJSON(w, http.StatusOK, client.SandboxList{Sandboxes: out})
}

// listQuery is what GET /v1/sandboxes asks: a state, labels, and (paged)
// a page of limit records after cursor.
type listQuery struct {
	state  lifecycle.State
	labels map[string]string
	paged  bool
	limit  int
	cursor string
}

// defaultPageLimit is a page's size when a cursor comes without a limit.
const defaultPageLimit = 100

// parseListQuery reads ?state=&label=k=v&limit=&cursor=; a limit or a
// cursor asks for a page.
func parseListQuery(r *http.Request) (listQuery, error) {
	v := r.URL.Query()
	q := listQuery{state: lifecycle.State(v.Get("state")), cursor: strings.ToLower(v.Get("cursor"))}
	if q.state != "" && !lifecycle.ValidState(q.state) {
		return q, fmt.Errorf("%w: state %q is not one of %v", lifecycle.ErrInvalid, q.state, lifecycle.States)
	}
	for _, kv := range v["label"] {
		k, val, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return q, fmt.Errorf("%w: label %q is not key=value", lifecycle.ErrInvalid, kv)
		}
		if q.labels == nil {
			q.labels = map[string]string{}
		}
		q.labels[k] = val
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > lifecycle.MaxPageLimit {
			return q, fmt.Errorf("%w: limit %q is not a whole number from 1 to %d", lifecycle.ErrInvalid, l, lifecycle.MaxPageLimit)
		}
		q.limit, q.paged = n, true
	}
	if q.cursor != "" {
		if !lifecycle.ValidID(q.cursor) {
			return q, fmt.Errorf("%w: cursor %q is not one this API gave (the next of an earlier page)", lifecycle.ErrInvalid, v.Get("cursor"))
		}
		q.paged = true
		if q.limit == 0 {
			q.limit = defaultPageLimit
		}
	}
	return q, nil
}

// sandboxID reads and checks the {id} path value; ids are case-insensitive.
func sandboxID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := strings.ToLower(r.PathValue("id"))
	if !lifecycle.ValidID(id) {
		web.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("sandbox %q: not found (ids are 1-%d characters of [0-9a-z])", r.PathValue("id"), lifecycle.MaxIDLen), 0)
		return "", false
	}
	return id, true
}

// recordOp serves an operation on one sandbox that answers its record.
func (api *Handler) recordOp(w http.ResponseWriter, r *http.Request, e *gateway.Gateway, op func(id string) (lifecycle.Record, error)) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	rec, err := op(id)
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	web.WriteJSON(w, http.StatusOK, view(e, &rec))
}

func (api *Handler) get(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	api.recordOp(w, r, e, e.Mgr.Get)
}

func (api *Handler) wake(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	api.recordOp(w, r, e, func(id string) (lifecycle.Record, error) {
		e.Guard.Reset(id) // an explicit wake ends a failure backoff
		return e.Mgr.Wake(r.Context(), id)
	})
}

func (api *Handler) patch(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	var body patchBody
	if !decodeBody(w, r, &body) {
		return
	}
	var (
		p   lifecycle.Patch
		err error
	)
	p.Access, p.PublicCard = body.Access, body.PublicCard
	if body.Egress != nil {
		p.Egress = &lifecycle.Egress{Policy: body.Egress.Policy, Allow: body.Egress.Allow, Deny: body.Egress.Deny}
	}
	if p.IdlePause, err = parseOptionalDuration("idle_pause", body.IdlePause); err == nil {
		if p.IdleStop, err = parseOptionalDuration("idle_stop", body.IdleStop); err == nil {
			p.MaxLifetime, err = parseOptionalDuration("max_lifetime", body.MaxLifetime)
		}
	}
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	api.recordOp(w, r, e, func(id string) (lifecycle.Record, error) { return e.Mgr.Update(id, p) })
}

// Preview token lifetimes.
const (
	defaultTokenTTL = time.Hour
	maxTokenTTL     = 90 * 24 * time.Hour
)

func (api *Handler) createToken(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	var body client.TokenRequest
	if r.ContentLength != 0 && !decodeBody(w, r, &body) {
		return
	}
	ttl := defaultTokenTTL
	if body.TTL != "" {
		d, err := caddy.ParseDuration(body.TTL)
		if err != nil || d <= 0 || d > maxTokenTTL {
			web.WriteError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("ttl: %q is not a duration between 1s and %s", body.TTL, maxTokenTTL), 0)
			return
		}
		ttl = d
	}
	if len(body.Subject) > 200 || strings.ContainsAny(body.Subject, "|\x00") {
		web.WriteError(w, http.StatusBadRequest, "invalid", "subject: at most 200 characters, without | or NUL", 0)
		return
	}
	rec, err := e.Mgr.Get(id)
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	s := e.Current.Load()
	exp := time.Now().Add(ttl).Truncate(time.Second)
	token := gateway.SignToken(s.PreviewSecret, id, rec.Incarnation, rec.TokenGeneration, exp, body.Subject)
	link := s.PreviewURLOf(id, rec.Spec.Ports[0]) + "?" + gateway.TokenQueryParam + "=" + url.QueryEscape(token)
	web.WriteJSON(w, http.StatusCreated, client.Token{Token: token, URL: link, ExpiresAt: exp.UTC()})
}

func (api *Handler) revokeTokens(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	if _, err := e.Mgr.RotateTokens(id); err != nil {
		web.WriteEngineError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (api *Handler) pause(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	api.recordOp(w, r, e, func(id string) (lifecycle.Record, error) { return e.Mgr.Pause(r.Context(), id, "api") })
}

func (api *Handler) stop(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	api.recordOp(w, r, e, func(id string) (lifecycle.Record, error) { return e.Mgr.Stop(r.Context(), id, "api") })
}

func (api *Handler) keepalive(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	var body client.KeepaliveRequest
	if !decodeBody(w, r, &body) {
		return
	}
	d, err := caddy.ParseDuration(body.For)
	if err != nil {
		web.WriteError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("for: %q is not a duration like \"10m\"", body.For), 0)
		return
	}
	api.recordOp(w, r, e, func(id string) (lifecycle.Record, error) { return e.Mgr.Keepalive(id, d) })
}

func (api *Handler) destroy(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	if err := e.Mgr.Destroy(r.Context(), id, "api"); err != nil {
		web.WriteEngineError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (api *Handler) purge(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	freed, err := e.Mgr.Purge(r.Context(), id, "api")
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	web.WriteJSON(w, http.StatusOK, client.PurgeResult{FreedBytes: freed})
}

func (api *Handler) history(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	q, err := parseHistoryQuery(r)
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	evs, err := e.Mgr.History(id)
	if err != nil {
		web.WriteEngineError(w, err)
		return
	}
	// Only the incarnations the caller sees: another tenant's earlier
	// sandbox of the same id is not its history.
	who := principalOf(r)
	evs = slices.DeleteFunc(evs, func(ev lifecycle.Event) bool { return !who.seesEvent(&ev) })
	if len(evs) == 0 {
		web.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("sandbox %s: no history", id), 0)
		return
	}
	if !q.paged {
		web.WriteJSON(w, http.StatusOK, historyPage{Events: evs})
		return
	}
	// Event ids only grow, so a page after an id never repeats an event
	// or skips one logged since the page before.
	first := slices.IndexFunc(evs, func(ev lifecycle.Event) bool { return ev.ID > q.after })
	if first < 0 {
		first = len(evs)
	}
	evs = evs[first:]
	page := historyPage{Events: evs[:min(len(evs), q.limit)]}
	if len(evs) > q.limit {
		page.Next = page.Events[q.limit-1].ID
	}
	web.WriteJSON(w, http.StatusOK, page)
}

// historyPage is the answer of GET /v1/sandboxes/{id}/history
// (client.History).
type historyPage struct {
	Events []lifecycle.Event `json:"events"`
	Next   uint64            `json:"next,omitempty"`
}

// historyQuery is what GET /v1/sandboxes/{id}/history asks: every event,
// or (paged) a page of limit events after the event id after.
type historyQuery struct {
	paged bool
	limit int
	after uint64
}

// parseHistoryQuery reads ?limit=&after=; either asks for a page, of
// defaultPageLimit events when only after is given.
func parseHistoryQuery(r *http.Request) (historyQuery, error) {
	v := r.URL.Query()
	var q historyQuery
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > lifecycle.MaxPageLimit {
			return q, fmt.Errorf("%w: limit %q is not a whole number from 1 to %d", lifecycle.ErrInvalid, l, lifecycle.MaxPageLimit)
		}
		q.limit, q.paged = n, true
	}
	if a := v.Get("after"); a != "" {
		n, err := strconv.ParseUint(a, 10, 64)
		if err != nil {
			return q, fmt.Errorf("%w: after %q is not an event id (the next of an earlier page)", lifecycle.ErrInvalid, a)
		}
		q.after, q.paged = n, true
		if q.limit == 0 {
			q.limit = defaultPageLimit
		}
	}
	return q, nil
}

// eventsReplayPage is how many logged events one replay read returns.
const eventsReplayPage = 500

// events streams transitions as server-sent events (GET /v1/events,
// ?sandbox=<id> to follow one sandbox). Each message carries the event's id,
// so a client that reconnects with Last-Event-ID (header, or ?last_event_id=)
// receives exactly what it missed, from the event log. Live events come from a
// bounded subscription; a client too slow for it is not dropped: the stream
// goes back to the log from its last id and carries on, so slow readers never
// hold up transitions and never miss an event.
func (api *Handler) events(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
	filter := strings.ToLower(r.URL.Query().Get("sandbox"))
	if filter != "" && !lifecycle.ValidID(filter) {
		web.WriteError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("sandbox %q is not a sandbox id", filter), 0)
		return
	}
	last, resume, err := web.LastEventID(r)
	if err != nil {
		web.WriteError(w, http.StatusBadRequest, "invalid", err.Error(), 0)
		return
	}
	sub := e.Mgr.Subscribe()
	defer func() { sub.Cancel() }()
	// In a cluster, other nodes' transitions come from the catalog watch
	// (nil channel on a single host: never ready).
	var remote *peer.Subscription
	var remoteC <-chan peer.Event
	if e.Cluster != nil {
		remote = e.Cluster.Remote.Subscribe()
		remoteC = remote.C
		defer func() { remote.Cancel() }()
	}
	if resume {
		// A resume point beyond the log (a wiped store restarts ids) would
		// silently skip live events: start from now instead.
		if newest, err := e.Mgr.LastEventID(); err == nil && last > newest {
			last = newest
		}
	} else {
		// No resume point: only what happens from now on.
		n, err := e.Mgr.LastEventID()
		if err != nil {
			web.WriteEngineError(w, err)
			return
		}
		last = n
	}
	stream := web.StartSSE(w)
	defer stream.Stop()
	if stream.Comment("sandwake events") != nil {
		return
	}
	who := principalOf(r)
	send := func(ev lifecycle.Event) error {
		last = ev.ID
		if (filter != "" && ev.SandboxID != filter) || !who.seesEvent(&ev) {
			return nil
		}
		return stream.Event(ev)
	}
	for {
		// Replay from the log everything after last: on connect, and
		// after the live subscription dropped us for being slow.
		for {
			evs, err := e.Mgr.EventsAfter(last, eventsReplayPage)
			if err != nil {
				return
			}
			for _, ev := range evs {
				if send(ev) != nil {
					return
				}
			}
			if stream.Flush() != nil {
				return
			}
			if len(evs) < eventsReplayPage {
				break
			}
		}
	live:
		for {
			select {
			case <-r.Context().Done():
				return
			case <-api.stopping:
				return // the client resumes from the last id it saw
			case ev, ok := <-sub.C:
				if !ok {
					if !sub.Lagged() {
						return // shutting down
					}
					sub = e.Mgr.Subscribe()
					break live
				}
				if ev.ID <= last {
					continue
				}
				if send(ev) != nil || stream.Flush() != nil {
					return
				}
			case ev, ok := <-remoteC:
				if !ok {
					if !remote.Lagged {
						return // shutting down
					}
					remote = e.Cluster.Remote.Subscribe()
					remoteC = remote.C
					continue
				}
				if (filter != "" && ev.SandboxID != filter) || !who.sees(ev.Labels) {
					continue
				}
				if stream.Data(ev) != nil || stream.Flush() != nil {
					return
				}
			case <-stream.Heartbeat:
				if stream.KeepAlive() != nil {
					return
				}
			}
		}
	}
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func optDuration(d *time.Duration) string {
	if d == nil {
		return ""
	}
	return d.String()
}

// view renders a record for the API, with its preview URLs and the
// in-memory activity the store has not been told of yet.
func view(e *gateway.Gateway, r *lifecycle.Record) recordView {
	s := e.Current.Load()
	v := recordView{
		ID: r.ID, State: string(r.State), Reason: r.Reason, Error: r.Error,
		Image: r.Spec.Image, Cmd: r.Spec.Cmd, EnvKeys: slices.Sorted(maps.Keys(r.Spec.Env)), Ports: r.Spec.Ports,
		URLs: make(map[string]string, len(r.Spec.Ports)), MemoryMB: r.Spec.MemoryMB, CPUs: r.Spec.CPUs,
		WorkspacePath: r.Spec.WorkspacePath, ReadyPath: r.Spec.ReadyPath,
		IdlePause: optDuration(r.Spec.IdlePause), IdleStop: optDuration(r.Spec.IdleStop), MaxLifetime: optDuration(r.Spec.MaxLifetime),
		Labels: r.Spec.Labels, Access: r.Spec.Access, PublicCard: r.Spec.PublicCard,
		CreatedAt: r.CreatedAt, LastActiveAt: r.LastActiveAt, StateSince: r.StateSince,
		ExpiresAt: optTime(r.ExpiresAt), KeepaliveUntil: optTime(r.KeepaliveUntil), VerifiedAt: optTime(r.VerifiedAt),
		Node: e.NodeName(), Template: r.Template,
	}
	if eg := r.Spec.Egress; eg.Policy != "" {
		v.Egress = &client.Egress{Policy: eg.Policy, Allow: eg.Allow, Deny: eg.Deny}
	}
	v.Activity = r.Spec.Activity
	v.User, v.CapAdd, v.Runtime = r.Spec.User, r.Spec.CapAdd, r.Spec.Runtime
	v.ReadonlyRootfs = r.Spec.ReadonlyRootfs != nil && *r.Spec.ReadonlyRootfs
	v.DiskMB = r.Spec.DiskMB
	if used, ok := e.Mgr.DiskUsed(r.ID); ok && (r.State == lifecycle.Running || r.State == lifecycle.Paused) {
		mb := used >> 20
		v.DiskUsedMB = &mb
	}
	if r.Address.IsValid() {
		v.Address = r.Address.String()
		v.EgressDenied = e.Mgr.EgressDenied(r.ID, gateway.EgressCountersMaxAge)
	}
	if v.EnvKeys == nil {
		v.EnvKeys = []string{}
	}
	if len(r.Spec.Services) > 0 {
		v.Services, v.GroupMemoryMB = servicesView(r, e.Mgr.ServiceDiskUsed(r.ID))
	}
	for _, p := range r.Spec.Ports {
		v.URLs[strconv.Itoa(p)] = s.PreviewURLOf(r.ID, p)
	}
	a := e.Mgr.Activity(r.ID)
	if t := a.LastActive(); t.After(v.LastActiveAt) {
		v.LastActiveAt = t
	}
	v.OpenConnections = a.OpenConnections()
	return v
}

// Interface guard.
var _ http.Handler = (*Handler)(nil)
