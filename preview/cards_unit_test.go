package preview

import (
	"bytes"
	"compress/gzip"
	"strings"
	"testing"

	"github.com/andybalholm/brotli"
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
