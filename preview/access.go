package preview

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sandwake/sandwake/gateway"
)

// presentedToken finds the token a request carries: the query parameter
// (first visit), a Bearer header with a sandwake token, or the cookie.
func presentedToken(r *http.Request) (token string, fromQuery bool) {
	if r.URL.RawQuery != "" {
		if t := r.URL.Query().Get(gateway.TokenQueryParam); t != "" {
			return t, true
		}
	}
	for _, v := range r.Header.Values("Authorization") {
		if b, ok := gateway.PreviewBearer(v); ok {
			return b, false
		}
	}
	for _, name := range []string{gateway.TokenCookieHost, gateway.TokenCookie} {
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
			_, ok := gateway.PreviewBearer(v)
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
		nv, removed := withoutCookie(v, gateway.TokenCookie)
		nv, removedHost := withoutCookie(nv, gateway.TokenCookieHost)
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
	q.Del(gateway.TokenQueryParam)
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
	name, secure := gateway.TokenCookie, visitorHTTPS(r)
	if secure {
		name = gateway.TokenCookieHost
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
