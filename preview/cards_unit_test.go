package preview

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestCardFromCompressedPrefixes: a card is read from the first bytes of
// a gzip or brotli answer, the stream cut mid-way as the card reader keeps
// it.
func TestCardFromCompressedPrefixes(t *testing.T) {
	page := `<html><head><title>T &amp; U</title><meta property="og:title" content="O"><meta name="twitter:card" content="summary"></head><body>` +
		strings.Repeat("<p>filler text that does not compress to nothing 0123456789</p>", 4000) + `</body></html>`
	var gz, br bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(page))
	zw.Close()
	bw := brotli.NewWriter(&br)
	bw.Write([]byte(page))
	bw.Close()
	for _, tc := range []struct {
		enc  string
		body []byte
	}{{"", []byte(page)}, {"gzip", gz.Bytes()}, {"br", br.Bytes()}} {
		prefix := tc.body[:min(len(tc.body), 2048)]
		c, ok := ParseCard(decodePrefix(prefix, tc.enc))
		if !ok || c.Title != "T & U" || len(c.Meta) != 2 || c.Meta[0] != [2]string{"og:title", "O"} {
			t.Errorf("%q: card %+v %v", tc.enc, c, ok)
		}
	}
	if c, ok := ParseCard([]byte("<html><body>no head tags</body></html>")); ok {
		t.Errorf("a page without tags gave a card: %+v", c)
	}
}

// TestCardWriterKeepsThePageAfterEarlyHints: an app that sends 103 Early
// Hints before its page still has the page's first bytes kept, and the
// client gets both answers.
func TestCardWriterKeepsThePageAfterEarlyHints(t *testing.T) {
	rec := &codesWriter{h: http.Header{}}
	cw := &cardWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: rec}}
	cw.Header().Set("Link", "</style.css>; rel=preload")
	cw.WriteHeader(http.StatusEarlyHints)
	cw.Header().Set("Content-Type", "text/html; charset=utf-8")
	cw.WriteHeader(http.StatusOK)
	page := "<html><head><title>T</title></head></html>"
	if _, err := cw.Write([]byte(page)); err != nil {
		t.Fatal(err)
	}
	if !cw.keep || string(cw.buf) != page {
		t.Errorf("after a 103 the page was not kept: keep %v, %q", cw.keep, cw.buf)
	}
	if !slices.Equal(rec.codes, []int{http.StatusEarlyHints, http.StatusOK}) || rec.body.String() != page {
		t.Errorf("the client got %v %q", rec.codes, rec.body.String())
	}
}

// codesWriter records every status written (httptest's recorder takes
// the first as final).
type codesWriter struct {
	h     http.Header
	codes []int
	body  bytes.Buffer
}

func (w *codesWriter) Header() http.Header         { return w.h }
func (w *codesWriter) WriteHeader(code int)        { w.codes = append(w.codes, code) }
func (w *codesWriter) Write(p []byte) (int, error) { return w.body.Write(p) }

// TestCardImageFetchedOnce: an og:image is fetched by one page load at a
// time, not again once kept, and a failed one not again for a while.
func TestCardImageFetchedOnce(t *testing.T) {
	var ci cardImages
	now := time.Now()
	if !ci.claim("a", 80, "/og.png", now) {
		t.Fatal("the first page load does not fetch the image")
	}
	if ci.claim("a", 80, "/og.png", now) {
		t.Error("a second page load fetches an image under way")
	}
	ci.put("a", 80, "/og.png", "image/png", []byte("png"))
	if ci.claim("a", 80, "/og.png", now.Add(2*cardImageRetry)) {
		t.Error("a kept image is fetched again")
	}
	// /missing.png's fetch failed (nothing put): tried again only later.
	if !ci.claim("a", 80, "/missing.png", now) || ci.claim("a", 80, "/missing.png", now.Add(cardImageRetry/2)) {
		t.Error("a failed image is fetched again at once")
	}
	if !ci.claim("a", 80, "/missing.png", now.Add(cardImageRetry)) {
		t.Error("a failed image is never tried again")
	}
	for i := range 4 * cardImagesMax {
		ci.claim("b", 80, fmt.Sprintf("/%d.png", i), now)
	}
	if len(ci.tried) > 4*cardImagesMax {
		t.Errorf("%d fetches remembered, bound %d", len(ci.tried), 4*cardImagesMax)
	}
}
