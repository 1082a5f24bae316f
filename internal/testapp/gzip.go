package main

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// gzipMember is one gzip member of 1 MiB of zeros (about 1 KiB): a body of
// n of them inflates to n MiB (a reader of gzip reads concatenated
// members as one stream).
var gzipMember = sync.OnceValue(func() []byte {
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	zw.Write(make([]byte, 1<<20))
	zw.Close()
	return b.Bytes()
})

// gzipHandler serves /gzip?mb=N (default 1024, at most 4096): to a request
// whose Accept-Encoding takes gzip, or with always=1 whatever it takes, a
// pre-compressed body of about N KiB that inflates to N MiB of zeros, as
// Content-Encoding: gzip; to others a short identity answer. Either way
// X-Seen-Accept-Encoding says what Accept-Encoding the app got.
func gzipHandler(w http.ResponseWriter, r *http.Request) {
	n := 1024
	if v, err := strconv.Atoi(r.URL.Query().Get("mb")); err == nil && v > 0 && v <= 4096 {
		n = v
	}
	ae := r.Header.Get("Accept-Encoding")
	w.Header().Set("X-Seen-Accept-Encoding", ae)
	if !strings.Contains(ae, "gzip") && r.URL.Query().Get("always") != "1" {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("identity: no gzip was asked for\n"))
		return
	}
	m := gzipMember()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Set("Content-Length", strconv.Itoa(n*len(m)))
	for range n {
		if _, err := w.Write(m); err != nil {
			return
		}
	}
}
