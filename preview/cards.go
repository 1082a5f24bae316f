package preview

import (
	"bytes"
	"compress/gzip"
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	xhtml "golang.org/x/net/html"

	"github.com/sandwake/sandwake/gateway"
	"github.com/sandwake/sandwake/lifecycle"
)

// This file gives a sleeping sandbox's pasted link a card: the tags of its
// app's last top-level page (title, description, og:*, twitter:*) are read
// from the first bytes of a page load's 200 text/html answer (gzip or
// brotli decoded), after the answer went out, and kept (lifecycle.SetCard: written
// with the activity flush); an unfurl bot (a no-wake User-Agent) asking a
// sleeping public sandbox gets a small page of those tags, HTML-escaped,
// and its state, without a wake. An og:image on the sandbox's own host is
// fetched once while the sandbox runs and served to bots from memory.
// Private sandboxes give no card unless their owner set public_card.

// cardPrefix is how much of a page is read for its tags.
const cardPrefix = 32 << 10

// cardImageMax bounds one kept og:image; cardImagesMax how many are kept.
const (
	cardImageMax  = 1 << 20
	cardImagesMax = 64
)

// cardWriter passes a page load's answer through, keeping the first
// cardPrefix bytes of a 200 text/html body.
type cardWriter struct {
	caddyhttp.ResponseWriterWrapper
	wrote  bool
	keep   bool
	encode string
	buf    []byte
}

func (c *cardWriter) WriteHeader(code int) {
	if code < http.StatusOK {
		// An informational answer (103 Early Hints) comes before the
		// page's own.
		c.ResponseWriterWrapper.WriteHeader(code)
		return
	}
	if !c.wrote {
		c.wrote = true
		h := c.Header()
		ct := strings.ToLower(h.Get("Content-Type"))
		c.encode = strings.ToLower(h.Get("Content-Encoding"))
		c.keep = code == http.StatusOK && strings.HasPrefix(ct, "text/html") && (c.encode == "" || c.encode == "gzip" || c.encode == "br")
	}
	c.ResponseWriterWrapper.WriteHeader(code)
}

func (c *cardWriter) Write(p []byte) (int, error) {
	if !c.wrote {
		c.WriteHeader(http.StatusOK)
	}
	if c.keep && len(c.buf) < cardPrefix {
		c.buf = append(c.buf, p[:min(len(p), cardPrefix-len(c.buf))]...)
	}
	return c.ResponseWriterWrapper.Write(p)
}

// ReadFrom goes through Write (the wrapper's would bypass it).
func (c *cardWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{c}, r)
}

type writerOnly struct{ io.Writer }

// captureCard wraps w for a page load of a sandbox with a card (public, or
// private with public_card); nil when it does not (then w goes as it is).
// finishCard reads the card from what passed, in the background.
func captureCard(w http.ResponseWriter, r *http.Request, rt *gateway.Route) *cardWriter {
	// The cheap tests first: this runs on every request to a running
	// sandbox, and only page loads (Accept: text/html) go further.
	if r.Method != http.MethodGet || !rt.Cards {
		return nil
	}
	if a := r.Header["Accept"]; len(a) == 0 || !strings.Contains(a[0], "text/html") || !isPageLoad(r) {
		return nil
	}
	return &cardWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

// finishCard hands what cw kept of a page load to readCard, off the
// request's clock.
func (g *Handler) finishCard(cw *cardWriter, r *http.Request, e *gateway.Gateway, rt *gateway.Route, port int) {
	if !cw.keep || len(cw.buf) == 0 {
		return
	}
	up := ""
	if u := rt.Upstreams[port]; u != nil {
		up = u.Dial
	}
	go g.readCard(e, rt.ID, port, r.Host, up, cw.buf, cw.encode)
}

// readCard parses a page's tags and keeps them; an og:image on the
// sandbox's own host is fetched from its upstream.
func (g *Handler) readCard(e *gateway.Gateway, id string, port int, host, upstream string, body []byte, enc string) {
	c, ok := ParseCard(decodePrefix(body, enc))
	if !ok {
		return
	}
	e.Mgr.SetCard(id, port, c)
	img := cardImage(c)
	if img == "" || upstream == "" {
		return
	}
	u, err := url.Parse(img)
	if err != nil || (u.Host != "" && !strings.EqualFold(u.Host, host)) || !strings.HasPrefix(u.Path, "/") {
		return // elsewhere: left as it is
	}
	if !g.cardImages.claim(id, port, u.RequestURI(), time.Now()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+upstream+u.RequestURI(), nil)
	if err != nil {
		return
	}
	req.Host = host
	resp, err := cardClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	ct := resp.Header.Get("Content-Type")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "image/") || resp.Header.Get("Content-Encoding") != "" {
		return
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, cardImageMax+1))
	if err != nil || len(b) > cardImageMax {
		return
	}
	g.cardImages.put(id, port, u.RequestURI(), ct, b)
}

// decodePrefix decodes the first bytes of a body in content encoding enc
// ("", gzip or br) as far as they go (a prefix ends mid-stream).
func decodePrefix(body []byte, enc string) []byte {
	var r io.Reader
	switch enc {
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil
		}
		r = zr
	case "br":
		r = brotli.NewReader(bytes.NewReader(body))
	default:
		return body
	}
	out, _ := io.ReadAll(io.LimitReader(r, cardPrefix)) // ErrUnexpectedEOF expected
	return out
}

// cardClient fetches a card's image from its sandbox. It asks for no
// encoding (an image is kept and served as it came, and the gateway
// inflates nothing of a sandbox's), and follows no redirect.
var cardClient = &http.Client{Timeout: 5 * time.Second, Transport: identityTransport(), CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func identityTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DisableCompression = true
	return t
}

// cardImage is a card's og:image (or twitter:image).
func cardImage(c lifecycle.Card) string {
	for _, name := range []string{"og:image", "og:image:url", "twitter:image"} {
		for _, m := range c.Meta {
			if m[0] == name {
				return m[1]
			}
		}
	}
	return ""
}

// ParseCard reads a page's <title> and its description, og:* and
// twitter:* meta tags (bounded); false when it has none.
func ParseCard(page []byte) (lifecycle.Card, bool) {
	var c lifecycle.Card
	z := xhtml.NewTokenizer(bytes.NewReader(page))
	inTitle := false
	clip := func(s string) string {
		s = strings.TrimSpace(s)
		if len(s) > lifecycle.MaxCardValue {
			s = s[:lifecycle.MaxCardValue]
		}
		return s
	}
	for {
		switch z.Next() {
		case xhtml.ErrorToken:
			return c, c.Title != "" || c.Description != "" || len(c.Meta) > 0
		case xhtml.StartTagToken, xhtml.SelfClosingTagToken:
			name, hasAttr := z.TagName()
			switch string(name) {
			case "title":
				inTitle = c.Title == ""
			case "body":
				return c, c.Title != "" || c.Description != "" || len(c.Meta) > 0
			case "meta":
				var key, content string
				for hasAttr {
					var k, v []byte
					k, v, hasAttr = z.TagAttr()
					switch string(k) {
					case "property", "name":
						key = strings.ToLower(string(v))
					case "content":
						content = string(v)
					}
				}
				switch {
				case key == "description":
					c.Description = clip(content)
				case (strings.HasPrefix(key, "og:") || strings.HasPrefix(key, "twitter:")) && len(c.Meta) < lifecycle.MaxCardMeta:
					c.Meta = append(c.Meta, [2]string{clip(key), clip(content)})
				}
			}
		case xhtml.TextToken:
			if inTitle {
				c.Title = clip(string(z.Text()))
				inTitle = false
			}
		case xhtml.EndTagToken:
			if name, _ := z.TagName(); string(name) == "head" {
				return c, c.Title != "" || c.Description != "" || len(c.Meta) > 0
			}
		}
	}
}

// writeCard answers an unfurl bot with the card of a sleeping sandbox.
func writeCard(w http.ResponseWriter, c lifecycle.Card, state string) {
	var b strings.Builder
	b.WriteString("<!doctype html><html><head><meta charset=\"utf-8\">")
	if c.Title != "" {
		b.WriteString("<title>" + html.EscapeString(c.Title) + "</title>")
	}
	if c.Description != "" {
		b.WriteString(`<meta name="description" content="` + html.EscapeString(c.Description) + `">`)
	}
	for _, m := range c.Meta {
		attr := "property"
		if strings.HasPrefix(m[0], "twitter:") {
			attr = "name"
		}
		b.WriteString(`<meta ` + attr + `="` + html.EscapeString(m[0]) + `" content="` + html.EscapeString(m[1]) + `">`)
	}
	b.WriteString(`<meta name="sandwake-state" content="` + html.EscapeString(state) + `">`)
	b.WriteString("</head><body><p>" + html.EscapeString(c.Title) + " (" + html.EscapeString(state) + ")</p></body></html>")
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Robots-Tag", "noindex")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, b.String())
}

// cardImagesKept counts the og:images kept (tests wait on it).
var cardImagesKept atomic.Int64

// cardImages keeps og:images of sandboxes' own hosts, bounded.
type cardImages struct {
	mu    sync.Mutex
	by    map[string]cardImg
	keys  []string             // oldest first
	tried map[string]time.Time // fetches under way or failed, when
}

type cardImg struct {
	ctype string
	body  []byte
}

func imgKey(id string, port int, path string) string {
	return id + "\x00" + strconv.Itoa(port) + "\x00" + path
}

// cardImageRetry is how long an og:image whose fetch is under way or
// failed (not found, not an image, too big) is not fetched again: a page
// load does not cost its sandbox a fetch each time.
const cardImageRetry = time.Minute

// claim reports whether the og:image at path is to be fetched now: not
// kept, and not tried in the last cardImageRetry. A true claims it.
func (ci *cardImages) claim(id string, port int, path string, now time.Time) bool {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	k := imgKey(id, port, path)
	if _, ok := ci.by[k]; ok {
		return false
	}
	if t, ok := ci.tried[k]; ok && now.Sub(t) < cardImageRetry {
		return false
	}
	if len(ci.tried) >= 4*cardImagesMax {
		for k, t := range ci.tried {
			if now.Sub(t) >= cardImageRetry {
				delete(ci.tried, k)
			}
		}
		if len(ci.tried) >= 4*cardImagesMax {
			return false // that many fetches under way or failed: later
		}
	}
	if ci.tried == nil {
		ci.tried = map[string]time.Time{}
	}
	ci.tried[k] = now
	return true
}

func (ci *cardImages) put(id string, port int, path, ctype string, body []byte) {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	if ci.by == nil {
		ci.by = map[string]cardImg{}
	}
	k := imgKey(id, port, path)
	delete(ci.tried, k)
	if _, ok := ci.by[k]; !ok {
		ci.keys = append(ci.keys, k)
	}
	ci.by[k] = cardImg{ctype, body}
	cardImagesKept.Add(1)
	for len(ci.keys) > cardImagesMax {
		delete(ci.by, ci.keys[0])
		ci.keys = ci.keys[1:]
	}
}

func (ci *cardImages) get(id string, port int, path string) (cardImg, bool) {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	img, ok := ci.by[imgKey(id, port, path)]
	return img, ok
}

// serveCard answers an unfurl bot with the sandbox's card (or its kept
// og:image): on a sleeping sandbox with a card, and on a private one with
// public_card whatever its state; false when there is none.
func (g *Handler) serveCard(w http.ResponseWriter, r *http.Request, e *gateway.Gateway, rt *gateway.Route, port int) bool {
	if !rt.Cards || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		return false
	}
	if img, ok := g.cardImages.get(rt.ID, port, r.URL.RequestURI()); ok {
		w.Header().Set("Content-Type", img.ctype)
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		w.Write(img.body)
		countRequest(outcomeUnfurl)
		return true
	}
	c, ok := e.Mgr.Card(rt.ID, port)
	if !ok {
		return false
	}
	writeCard(w, c, string(rt.State))
	countRequest(outcomeUnfurl)
	return true
}
