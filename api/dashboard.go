package api

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
)

// dashboardHTML is the operator dashboard that sandwake_api serves at GET /.
// It is one self-contained page without data: it asks for the API token and
// reads everything from /v1/… with it, so loading it needs no token.
//
//go:embed dashboard/index.html
var dashboardHTML []byte

// dashboardCSP allows nothing but the page's own inline style and script
// (by hash, so an injected tag would not run) and requests to its origin.
var dashboardCSP = "default-src 'none'; " +
	"script-src " + strings.Join(inlineHashes(dashboardHTML, "script"), " ") + "; " +
	"style-src " + strings.Join(inlineHashes(dashboardHTML, "style"), " ") + "; " +
	"connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// inlineHashes returns the CSP source expressions ('sha256-…') of the
// contents of every <tag>…</tag> element of page.
func inlineHashes(page []byte, tag string) []string {
	open, end := []byte("<"+tag+">"), []byte("</"+tag+">")
	var out []string
	for {
		i := bytes.Index(page, open)
		if i < 0 {
			break
		}
		page = page[i+len(open):]
		j := bytes.Index(page, end)
		if j < 0 {
			break
		}
		sum := sha256.Sum256(page[:j])
		out = append(out, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
		page = page[j+len(end):]
	}
	if len(out) == 0 {
		return []string{"'none'"}
	}
	return out
}

// serveDashboard writes the dashboard page. It is public: the page holds no
// data, and every request it makes carries the token the operator enters.
func serveDashboard(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(dashboardHTML)))
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Robots-Tag", "noindex")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(dashboardHTML)
	}
}
