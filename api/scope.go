package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/internal/web"
	"github.com/sandwake/sandwake/lifecycle"
)

// Scope is what an API token may do. Each scope includes the ones below it.
type Scope int

// Scopes of API tokens.
const (
	// ScopeRead lists and reads sandboxes, their history and events, and
	// the nodes.
	ScopeRead Scope = iota + 1
	// ScopeOperate also wakes, stops, pauses, keeps alive and mints or
	// revokes preview tokens.
	ScopeOperate
	// ScopeAdmin does everything: create, destroy, purge, patch, drain and
	// remove nodes.
	ScopeAdmin
)

// String is the scope's name as the Caddyfile and the API write it.
func (s Scope) String() string {
	switch s {
	case ScopeRead:
		return "read"
	case ScopeOperate:
		return "operate"
	case ScopeAdmin:
		return "admin"
	}
	return fmt.Sprintf("scope(%d)", int(s))
}

// ParseScope reads a scope name.
func ParseScope(name string) (Scope, error) {
	switch name {
	case "read":
		return ScopeRead, nil
	case "operate":
		return ScopeOperate, nil
	case "admin", "":
		return ScopeAdmin, nil
	}
	return 0, fmt.Errorf("scope %q is not read, operate or admin", name)
}

// TokenConfig is one API token and what it may do.
type TokenConfig struct {
	// Secret is the bearer token; placeholders such as {env.DASH_TOKEN}
	// are replaced. Required.
	Secret string `json:"secret"`
	// Scope is read, operate or admin. Default: admin.
	Scope string `json:"scope,omitempty"`
	// Labels bind the token to a tenant: it sees and touches only
	// sandboxes carrying every one of these labels, and stamps them on the
	// sandboxes it creates.
	Labels map[string]string `json:"labels,omitempty"`
}

// principal is who made an API call: a token's scope and labels, a
// verified cluster node, or anyone when the API has no auth.
type principal struct {
	scope  Scope
	labels map[string]string // nil: every sandbox
	name   string            // for messages: "token 2", "node n1"
}

// everyone is the principal of an API without auth, and of a verified
// node (which forwards only calls its own API authorised).
var everyone = &principal{scope: ScopeAdmin, name: "admin"}

// apiToken is a provisioned token: its hash, for constant-time comparison.
type apiToken struct {
	hash [32]byte
	who  *principal
}

type principalKey struct{}

// principalOf is the caller of an authorised API request (set by authed).
func principalOf(r *http.Request) *principal {
	if p, ok := r.Context().Value(principalKey{}).(*principal); ok {
		return p
	}
	return everyone
}

// sees reports whether p may see a sandbox with labels.
func (p *principal) sees(labels map[string]string) bool { return lifecycle.HasLabels(labels, p.labels) }

// bound reports whether p is limited to some sandboxes.
func (p *principal) bound() bool { return len(p.labels) > 0 }

// provisionTokens builds the token table from Token (an admin token) and
// Tokens.
func (api *Handler) provisionTokens() error {
	repl := caddy.NewReplacer()
	api.tokens = api.tokens[:0]
	seen := map[[32]byte]bool{}
	add := func(i int, tc TokenConfig) error {
		name := fmt.Sprintf("token %d", i+1)
		secret := repl.ReplaceKnown(tc.Secret, "")
		if secret == "" {
			return fmt.Errorf("sandwake_api: %s (%s) is empty once placeholders are replaced (is the variable set?)", name, tc.Secret)
		}
		scope, err := ParseScope(tc.Scope)
		if err != nil {
			return fmt.Errorf("sandwake_api: %s: %w", name, err)
		}
		for k, v := range tc.Labels {
			if k == "" || len(k)+len(v) > lifecycle.MaxLabelBytes {
				return fmt.Errorf("sandwake_api: %s: label %q must be a non-empty key, key and value at most %d bytes", name, k, lifecycle.MaxLabelBytes)
			}
		}
		h := sha256.Sum256([]byte(secret))
		if seen[h] {
			return fmt.Errorf("sandwake_api: %s is the same secret as another token", name)
		}
		seen[h] = true
		if len(tc.Labels) > 0 {
			name += " (" + labelList(tc.Labels) + ")"
		}
		api.tokens = append(api.tokens, apiToken{hash: h, who: &principal{scope: scope, labels: maps.Clone(tc.Labels), name: name}})
		return nil
	}
	all := slices.Clone(api.Tokens)
	if api.Token != "" {
		all = append([]TokenConfig{{Secret: api.Token, Scope: "admin"}}, all...)
	}
	for i, tc := range all {
		if err := add(i, tc); err != nil {
			return err
		}
	}
	return nil
}

// labelList writes labels as k=v,k=v in key order.
func labelList(labels map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(labels)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + labels[k])
	}
	return b.String()
}

// caller is the principal of r's bearer token, nil when it carries none
// of the API's tokens. Every token is compared, in constant time.
func (api *Handler) caller(r *http.Request) *principal {
	given, ok := gateway.BearerCredentials(r.Header.Get("Authorization"))
	if !ok {
		return nil
	}
	gh := sha256.Sum256([]byte(given))
	var who *principal
	for i := range api.tokens {
		if subtle.ConstantTimeCompare(gh[:], api.tokens[i].hash[:]) == 1 {
			who = api.tokens[i].who
		}
	}
	return who
}

// callerValue is p as a forwarded call carries it (cluster.CallerHeader):
// "<scope>;<key>=<value>&…", keys and values query-escaped.
func (p *principal) callerValue() string {
	q := url.Values{}
	for k, v := range p.labels {
		q.Set(k, v)
	}
	return p.scope.String() + ";" + q.Encode()
}

// forwardedCaller reads the caller another node signed into a forwarded
// call (its signature was checked by the peer listener).
func forwardedCaller(r *http.Request, node string) (*principal, error) {
	v := r.Header.Get(cluster.CallerHeader)
	scopeName, labels, ok := strings.Cut(v, ";")
	if !ok {
		return nil, fmt.Errorf("a call forwarded by node %s carries no caller (%s): the node runs an older sandwake; upgrade it", node, cluster.CallerHeader)
	}
	scope, err := ParseScope(scopeName)
	if err != nil || scopeName == "" {
		return nil, fmt.Errorf("a call forwarded by node %s names no valid scope (%q)", node, scopeName)
	}
	q, err := url.ParseQuery(labels)
	if err != nil {
		return nil, fmt.Errorf("a call forwarded by node %s carries malformed labels: %v", node, err)
	}
	p := &principal{scope: scope, name: "a caller of node " + node}
	if len(q) > 0 {
		p.labels = make(map[string]string, len(q))
		for k := range q {
			p.labels[k] = q.Get(k)
		}
		p.name += " (" + labelList(p.labels) + ")"
	}
	return p, nil
}

// withPrincipal is r carrying p.
func withPrincipal(r *http.Request, p *principal) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
}

// writeForbidden answers a call beyond the caller's scope.
func writeForbidden(w http.ResponseWriter, r *http.Request, p *principal, need Scope) {
	web.WriteError(w, http.StatusForbidden, "forbidden",
		fmt.Sprintf("%s %s needs a token of scope %s; this one (%s) is %s", r.Method, r.URL.Path, need, p.name, p.scope), 0)
}

// visible reports whether who may see sandbox id: its labels, from this
// node's record or, for another node's sandbox (unless the call was
// forwarded here), the catalog (whose entries are signed by their owners); for an id without either, the labels of
// the record that made its kept volume (a tenant purges its own destroyed
// sandboxes' volumes and reads their history). An unknown id is not
// visible.
func visible(e *gateway.Gateway, id string, who *principal, forwarded bool) bool {
	if !who.bound() {
		return true
	}
	if rec, err := e.Mgr.Get(id); err == nil {
		return who.sees(rec.Spec.Labels)
	}
	// A forwarded call was sent here as to the owner: only this node's
	// records decide it, never the catalog.
	if e.Cluster != nil && !forwarded {
		if en, ok := e.Cluster.Lookup(id); ok {
			return who.sees(en.Labels)
		}
	}
	if o, err := e.Mgr.VolumeOwner(id); err == nil {
		return who.sees(o.Labels)
	}
	return false
}

// seesEvent reports whether p may see ev: an event carries the labels of the
// sandbox incarnation it is of, so an id destroyed and created again by
// another tenant starts a fresh history for each (events logged before
// events carried labels are seen by unscoped tokens only).
func (p *principal) seesEvent(ev *lifecycle.Event) bool { return p.sees(ev.Labels) }

// unbound wraps a handler that acts on the whole gateway or cluster (the
// nodes): a token bound to labels may not call it.
func (api *Handler) unbound(h func(http.ResponseWriter, *http.Request, *gateway.Gateway)) func(http.ResponseWriter, *http.Request, *gateway.Gateway) {
	return func(w http.ResponseWriter, r *http.Request, e *gateway.Gateway) {
		if who := principalOf(r); who.bound() {
			web.WriteError(w, http.StatusForbidden, "forbidden",
				fmt.Sprintf("%s %s acts on every tenant's sandboxes; this token (%s) is limited to its own", r.Method, r.URL.Path, who.name), 0)
			return
		}
		h(w, r, e)
	}
}

// whoami answers GET /v1/whoami: the caller's scope and labels, so that
// the dashboard and the CLI show only what the token may do.
func (api *Handler) whoami(w http.ResponseWriter, r *http.Request, _ *gateway.Gateway) {
	who := principalOf(r)
	web.WriteJSON(w, http.StatusOK, client.Identity{Scope: who.scope.String(), Labels: who.labels})
}

// unauthorizedMessage says why a call carries no valid token: no
// Authorization header, another scheme than Bearer, or a token that is not
// one of the API's.
func unauthorizedMessage(r *http.Request) string {
	auth := r.Header.Get("Authorization")
	if strings.TrimSpace(auth) == "" {
		return "missing Authorization header: send Authorization: Bearer <token>"
	}
	if _, ok := gateway.BearerCredentials(auth); !ok {
		scheme, _, _ := strings.Cut(strings.TrimSpace(auth), " ")
		if len(scheme) > 20 {
			scheme = scheme[:20] + "…"
		}
		return fmt.Sprintf("the Authorization header's scheme %q is not Bearer: send Authorization: Bearer <token>", scheme)
	}
	return "wrong bearer token: it is none of this API's tokens"
}
