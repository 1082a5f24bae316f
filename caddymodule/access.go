package caddymodule

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"golang.org/x/time/rate"
)

// Preview tokens.
//
// A token is "swt_" + base64url(payload) + "." + base64url(HMAC-SHA256(secret,
// payload + NUL + incarnation)), payload being
// "v2|<sandbox id>|<generation>|<expiry unix>|<subject>". It opens one
// sandbox until its expiry or until the sandbox's token generation is
// rotated (DELETE /v1/sandboxes/{id}/tokens, or a change of access). The
// sandbox's incarnation (drawn at every create) is signed but not carried: a
// token minted before a destroy or purge fails the check on a later sandbox
// with the same id, and the token does not tell the incarnation. Given once
// as ?sandwake_token=, it becomes a host-only HttpOnly cookie and the URL is
// redirected without it, so it does not linger in history or Referer.
//
// "v1" tokens (signed over the payload alone, minted before incarnations)
// are still accepted for records without an incarnation, which were made
// before incarnations existed.
const (
	tokenPrefix     = "swt_"
	tokenQueryParam = "sandwake_token"
	tokenCookie     = "sandwake_token"
	// tokenCookieHost is the cookie's name for a visitor on https: the
	// __Host- prefix makes browsers refuse it unless it is Secure, for
	// this host only (no Domain) and for every path, so that a sibling
	// preview cannot plant or shadow it.
	tokenCookieHost = "__Host-" + tokenCookie
	tokenVersion    = "v2"
)

// Token errors; none of them echoes the token.
var (
	errTokenMissing   = errors.New("this preview is private: a preview token is required")
	errTokenMalformed = errors.New("the preview token is malformed")
	errTokenInvalid   = errors.New("the preview token is not valid")
	errTokenOther     = errors.New("the preview token is for another sandbox")
	errTokenExpired   = errors.New("the preview token has expired")
	errTokenRevoked   = errors.New("the preview token has been revoked")
)

// tokenMAC signs a token payload for one incarnation of a sandbox. NUL
// cannot occur in a payload (subjects refuse it), so payload and
// incarnation cannot be shifted into each other.
func tokenMAC(secret []byte, payload, incarnation string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(payload))
	if !strings.HasPrefix(payload, "v1|") {
		h.Write([]byte{0})
		h.Write([]byte(incarnation))
	}
	return h.Sum(nil)
}

// signToken makes a preview token for incarnation inc of sandbox id.
func signToken(secret []byte, id, inc string, gen uint64, exp time.Time, subject string) string {
	payload := tokenVersion + "|" + id + "|" + strconv.FormatUint(gen, 10) + "|" + strconv.FormatInt(exp.Unix(), 10) + "|" + subject
	enc := base64.RawURLEncoding
	return tokenPrefix + enc.EncodeToString([]byte(payload)) + "." + enc.EncodeToString(tokenMAC(secret, payload, inc))
}

// verifyToken checks a token for incarnation inc of sandbox id at generation
// gen.
func verifyToken(secret []byte, token, id, inc string, gen uint64, now time.Time) error {
	if token == "" {
		return errTokenMissing
	}
	body, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || len(token) > 2048 {
		return errTokenMalformed
	}
	p64, m64, ok := strings.Cut(body, ".")
	if !ok {
		return errTokenMalformed
	}
	enc := base64.RawURLEncoding
	payload, err1 := enc.DecodeString(p64)
	mac, err2 := enc.DecodeString(m64)
	if err1 != nil || err2 != nil {
		return errTokenMalformed
	}
	parts := strings.SplitN(string(payload), "|", 5)
	if len(parts) != 5 || (parts[0] != tokenVersion && parts[0] != "v1") {
		return errTokenInvalid // not a payload sandwake signs
	}
	// Another sandbox's token is signed for that sandbox's incarnation,
	// which is not known here: the id is read before the MAC is checked
	// (the id is readable in the token anyway, and the token is refused
	// either way).
	if parts[1] != id {
		return errTokenOther
	}
	// A v1 token binds no incarnation: it can only be for a record made
	// before incarnations.
	if parts[0] == "v1" && inc != "" {
		return errTokenInvalid
	}
	if !hmac.Equal(mac, tokenMAC(secret, string(payload), inc)) {
		return errTokenInvalid
	}
	tgen, err1 := strconv.ParseUint(parts[2], 10, 64)
	exp, err2 := strconv.ParseInt(parts[3], 10, 64)
	if err1 != nil || err2 != nil {
		return errTokenMalformed
	}
	switch {
	case tgen != gen:
		return errTokenRevoked
	case !now.Before(time.Unix(exp, 0)):
		return errTokenExpired
	}
	return nil
}

// bearerCredentials returns the credentials of an Authorization value using
// the Bearer scheme. Auth schemes are case-insensitive (RFC 7235 §2.1), and
// one or more spaces separate the scheme from the credentials.
func bearerCredentials(authorization string) (string, bool) {
	scheme, rest, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.Trim(rest, " \t"), true
}

// previewBearer reports whether an Authorization value carries a sandwake
// preview token, and returns it.
func previewBearer(authorization string) (string, bool) {
	b, ok := bearerCredentials(authorization)
	if !ok || !strings.HasPrefix(b, tokenPrefix) {
		return "", false
	}
	return b, true
}

// presentedToken finds the token a request carries: the query parameter
// (first visit), a Bearer header with a sandwake token, or the cookie.
func presentedToken(r *http.Request) (token string, fromQuery bool) {
	if r.URL.RawQuery != "" {
		if t := r.URL.Query().Get(tokenQueryParam); t != "" {
			return t, true
		}
	}
	for _, v := range r.Header.Values("Authorization") {
		if b, ok := previewBearer(v); ok {
			return b, false
		}
	}
	for _, name := range []string{tokenCookieHost, tokenCookie} {
		if c, err := r.Cookie(name); err == nil {
			return c.Value, false
		}
	}
	return "", false
}

// stripToken removes sandwake's credentials from a request before it goes to
// the app: the app never sees preview tokens. Everything else is left as it
// came, byte for byte.
func stripToken(r *http.Request) {
	if auth := r.Header.Values("Authorization"); len(auth) > 0 {
		kept := slices.DeleteFunc(slices.Clone(auth), func(v string) bool {
			_, ok := previewBearer(v)
			return ok
		})
		if len(kept) != len(auth) {
			r.Header.Del("Authorization")
			if len(kept) > 0 {
				r.Header["Authorization"] = kept
			}
		}
	}
	cookies := r.Header.Values("Cookie")
	if len(cookies) == 0 {
		return
	}
	kept := make([]string, 0, len(cookies))
	changed := false
	for _, v := range cookies {
		nv, removed := withoutCookie(v, tokenCookie)
		nv, removedHost := withoutCookie(nv, tokenCookieHost)
		changed = changed || removed || removedHost
		if nv != "" {
			kept = append(kept, nv)
		}
	}
	if changed {
		r.Header.Del("Cookie")
		if len(kept) > 0 {
			r.Header["Cookie"] = kept
		}
	}
}

// withoutCookie removes every cookie called name from a Cookie header value,
// leaving the others exactly as they were: the string is cut, not parsed and
// written again, so values Go's cookie parser would refuse or re-quote (a
// quote inside, non-ASCII) reach the app unchanged. Cookie pairs are
// separated by ';', which no cookie value may contain (RFC 6265 §4.1.1).
func withoutCookie(header, name string) (string, bool) {
	if !strings.Contains(header, name) {
		return header, false
	}
	var b strings.Builder
	removed := false
	rest := header
	for rest != "" {
		pair, next, more := strings.Cut(rest, ";")
		n, _, _ := strings.Cut(pair, "=")
		if strings.Trim(n, " \t") == name {
			removed = true
		} else {
			if b.Len() == 0 {
				// The first pair kept starts the value: no separator
				// space before it.
				pair = strings.TrimLeft(pair, " \t")
			} else {
				b.WriteByte(';')
			}
			b.WriteString(pair)
		}
		if !more {
			break
		}
		rest = next
	}
	if !removed {
		return header, false
	}
	// A pair removed at the end leaves the space that preceded it.
	return strings.TrimRight(b.String(), " \t"), true
}

// withoutToken is r's URL (path and query) with the token parameter removed,
// as a path on this host.
func withoutToken(r *http.Request) string {
	q := r.URL.Query()
	q.Del(tokenQueryParam)
	target := r.URL.EscapedPath()
	if target == "" {
		target = "/"
	}
	if rq := q.Encode(); rq != "" {
		target += "?" + rq
	}
	return localPath(target)
}

// localPath returns target when every browser resolves it to a path on the
// host it was served from, else "/". Browsers read "//host", "/\host" and
// "\host" as another host, and drop tabs and newlines anywhere in a URL
// ("/\t/host"), so only a target starting with one '/' and then something
// else, made of printable ASCII without backslashes, is kept.
func localPath(target string) string {
	if len(target) == 0 || target[0] != '/' || (len(target) > 1 && target[1] == '/') {
		return "/"
	}
	for i := 0; i < len(target); i++ {
		if c := target[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return "/"
		}
	}
	return target
}

// setTokenCookie turns a valid first-visit token into a cookie for this
// preview host only (no Domain attribute), HttpOnly, SameSite=Lax, living as
// long as the token; for a visitor on https (visitorHTTPS), Secure and named
// with the __Host- prefix.
func setTokenCookie(w http.ResponseWriter, r *http.Request, token string, exp time.Time) {
	name, secure := tokenCookie, visitorHTTPS(r)
	if secure {
		name = tokenCookieHost
	}
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: token, Path: "/", Expires: exp,
		HttpOnly: true, Secure: secure, SameSite: http.SameSiteLaxMode,
	})
}

// visitorHTTPS reports whether the visitor reached the preview over https:
// this server's TLS, or the scheme a trusted proxy (Caddy's
// trusted_proxies) or a verified cluster node said in X-Forwarded-Proto.
// The header of anyone else is ignored.
func visitorHTTPS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool); !trusted {
		return false
	}
	proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	return strings.EqualFold(strings.TrimSpace(proto), "https")
}

// tokenExpiry reads the expiry of an already verified token.
func tokenExpiry(token string) time.Time {
	body := strings.TrimPrefix(token, tokenPrefix)
	p64, _, _ := strings.Cut(body, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(p64)
	parts := strings.SplitN(string(payload), "|", 5)
	if len(parts) < 4 {
		return time.Time{}
	}
	exp, _ := strconv.ParseInt(parts[3], 10, 64)
	return time.Unix(exp, 0)
}

// defaultNoWakeUserAgents are substrings (case-insensitive) of User-Agents
// that never wake a sandbox: search and social crawlers, link previewers and
// uptime monitors, which would otherwise keep every preview awake.
var defaultNoWakeUserAgents = []string{
	"bot", "crawler", "spider", "slurp", "facebookexternalhit", "embedly",
	"uptimerobot", "pingdom", "statuscake", "site24x7", "kube-probe",
	"elb-healthchecker", "googlehc",
}

// wakeGuard decides whether a request may wake a sandbox: not for crawler
// User-Agents, not faster than a global rate, and not again too soon for a
// sandbox whose wakes keep failing (exponential backoff, reset by an API
// wake or a success).
type wakeGuard struct {
	userAgents []string
	limiter    *rate.Limiter

	mu      sync.Mutex
	backoff map[string]*wakeBackoff
	// admitted holds sandboxes whose wake was let through the rate cap
	// lately: more requests for the same wake join it and take nothing
	// from the cap (the cap counts wakes, not requests).
	admitted map[string]time.Time
}

// admittedFor is how long a wake let through the cap covers later requests
// for the same sandbox (longer than a wake normally takes to register).
const admittedFor = 10 * time.Second

type wakeBackoff struct {
	failures int
	until    time.Time
}

// Backoff of failing wakes: 2s, 4s, … capped at 5 minutes.
const (
	wakeBackoffBase = 2 * time.Second
	wakeBackoffMax  = 5 * time.Minute
)

func newWakeGuard() *wakeGuard {
	return &wakeGuard{backoff: map[string]*wakeBackoff{}, admitted: map[string]time.Time{}}
}

// configure applies a config's settings; backoff state is kept across
// reloads.
func (g *wakeGuard) configure(userAgents []string, perSecond float64, burst int) {
	uas := make([]string, len(userAgents))
	for i, ua := range userAgents {
		uas[i] = strings.ToLower(ua)
	}
	var lim *rate.Limiter
	if perSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(perSecond), max(burst, 1))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.userAgents, g.limiter = uas, lim
}

// crawler reports whether a User-Agent must not wake sandboxes.
func (g *wakeGuard) crawler(ua string) bool {
	g.mu.Lock()
	uas := g.userAgents
	g.mu.Unlock()
	if ua == "" || len(uas) == 0 {
		return false
	}
	ua = strings.ToLower(ua)
	for _, s := range uas {
		if strings.Contains(ua, s) {
			return true
		}
	}
	return false
}

// backingOff reports whether sandbox id's wakes are paused after failures,
// and for how long still.
func (g *wakeGuard) backingOff(id string, now time.Time) (bool, time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.backoff[id]
	if b == nil || !now.Before(b.until) {
		return false, 0
	}
	return true, b.until.Sub(now)
}

// failed notes a failed wake of id.
func (g *wakeGuard) failed(id string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.backoff[id]
	if b == nil {
		b = &wakeBackoff{}
		g.backoff[id] = b
	}
	delete(g.admitted, id)
	b.failures++
	d := wakeBackoffBase << min(b.failures-1, 16)
	b.until = now.Add(min(d, wakeBackoffMax))
}

// reset clears id's backoff (a success, or an explicit API wake).
func (g *wakeGuard) reset(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.backoff, id)
	delete(g.admitted, id)
}

// Answers of wakeGuard.allowWake.
const (
	wakeAllowed       = iota
	wakeRefusedClient // the client's own wake budget is spent
	wakeRefusedGlobal // wakes come faster than wake_rate
)

// allowWake takes a wake of id from client's budget (clients) and from the
// global wake rate, answering wakeAllowed or which budget is spent.
// Requests for a wake already let through take nothing.
func (g *wakeGuard) allowWake(id string, clients *clientLimits, client netip.Prefix, now time.Time) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t, ok := g.admitted[id]; ok && now.Sub(t) < admittedFor {
		return wakeAllowed
	}
	ok, giveBack := clients.reserveWake(client, now)
	if !ok {
		return wakeRefusedClient
	}
	if g.limiter != nil && !g.limiter.AllowN(now, 1) {
		giveBack()
		return wakeRefusedGlobal
	}
	if len(g.admitted) > 10000 { // bounded: forget old entries
		for k, t := range g.admitted {
			if now.Sub(t) >= admittedFor {
				delete(g.admitted, k)
			}
		}
	}
	g.admitted[id] = now
	return wakeAllowed
}
