package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ForwardHeader carries the signature of a node-to-node request.
const ForwardHeader = "Sandwake-Forwarded"

// CallerHeader carries, on an API call one node forwards to another, who
// called: the scope and labels of the caller's token (see the API). The
// signature covers it, so the owner can decide on the call as the caller,
// against its own record.
const CallerHeader = "Sandwake-Caller"

// maxSkew is how old (or how far in the future) a signature may be.
const maxSkew = time.Minute

// Sign marks r as forwarded by this node: ForwardHeader set to
// "<node>;<unix seconds>;<hex hmac>" over node, time, method, host,
// request URI and CallerHeader with the cluster secret.
func (c *Cluster) Sign(r *http.Request) {
	var ts [20]byte
	var mac [sha256.Size]byte
	t := strconv.AppendInt(ts[:0], c.now().Unix(), 10)
	c.mac(mac[:0], c.cfg.Node, t, r)
	v := make([]byte, 0, len(c.cfg.Node)+len(t)+2+hex.EncodedLen(len(mac)))
	v = append(append(append(append(v, c.cfg.Node...), ';'), t...), ';')
	v = hex.AppendEncode(v, mac[:])
	r.Header[ForwardHeader] = []string{string(v)}
}

// Verify checks r's ForwardHeader: ok=false when r carries none;
// an error wrapping ErrUnsigned when it is present but not valid (wrong
// signature, unknown shape, older than a minute or from the future).
// ok is true only with a valid signature, node then naming the signer.
func (c *Cluster) Verify(r *http.Request) (node string, ok bool, err error) {
	vals := r.Header.Values(ForwardHeader)
	if len(vals) == 0 {
		return "", false, nil
	}
	if len(vals) > 1 {
		return "", false, fmt.Errorf("%w: %d %s headers", ErrUnsigned, len(vals), ForwardHeader)
	}
	if n := len(r.Header[CallerHeader]); n > 1 {
		return "", false, fmt.Errorf("%w: %d %s headers", ErrUnsigned, n, CallerHeader)
	}
	node, rest, ok1 := strings.Cut(vals[0], ";")
	ts, sig, ok2 := strings.Cut(rest, ";")
	if !ok1 || !ok2 || node == "" || strings.Contains(sig, ";") {
		return "", false, fmt.Errorf("%w: %s is not <node>;<unix seconds>;<hmac>", ErrUnsigned, ForwardHeader)
	}
	secs, perr := strconv.ParseInt(ts, 10, 64)
	if perr != nil {
		return "", false, fmt.Errorf("%w: bad time %q", ErrUnsigned, ts)
	}
	// The length first: hex.Decode writes past a destination too short
	// for its input.
	var got, want [sha256.Size]byte
	if len(sig) != hex.EncodedLen(len(got)) {
		return "", false, fmt.Errorf("%w: signature is not %d hex digits", ErrUnsigned, hex.EncodedLen(len(got)))
	}
	if _, herr := hex.Decode(got[:], []byte(sig)); herr != nil {
		return "", false, fmt.Errorf("%w: signature is not hex", ErrUnsigned)
	}
	if !hmac.Equal(got[:], c.mac(want[:0], node, []byte(ts), r)) {
		return "", false, fmt.Errorf("%w: wrong signature (claimed node %s)", ErrUnsigned, node)
	}
	// Checked after the signature, so the message about time is only
	// given for requests a node really signed.
	if skew := c.now().Sub(time.Unix(secs, 0)); skew > maxSkew || skew < -maxSkew {
		return "", false, fmt.Errorf("%w: signed by node %s %s from now, more than %s", ErrUnsigned, node, skew.Round(time.Second), maxSkew)
	}
	return node, true, nil
}

// mac appends to dst the HMAC-SHA256 of a forwarded request's signed
// fields. Its keyed hashes come from c.macs: a forwarded request is signed
// once and verified once, and a new keyed hash costs two hashes of the key.
func (c *Cluster) mac(dst []byte, node string, ts []byte, r *http.Request) []byte {
	method := r.Method
	if method == "" {
		method = http.MethodGet
	}
	host := r.Host
	if host == "" && r.URL != nil {
		host = r.URL.Host
	}
	// The URL's form of the URI, not the request line as received: a
	// forwarding gateway signs the request it received, but the transport
	// writes the URL's form on the wire (an absolute-form line loses its
	// scheme and host, a raw "|" or UTF-8 byte in the path is escaped),
	// and the owner parses that back to the same form.
	uri := r.RequestURI
	if r.URL != nil {
		uri = r.URL.RequestURI()
	}
	m, _ := c.macs.Get().(*macState)
	if m == nil {
		m = &macState{h: hmac.New(sha256.New, c.cfg.Secret)}
	}
	defer c.macs.Put(m)
	// One Write of the fields, each ended by a zero byte, from the
	// state's own buffer: what a hash.Hash is handed escapes, so that a
	// buffer of the caller's would be allocated on every request.
	b := append(m.buf[:0], node...)
	b = append(append(b, 0), ts...)
	b = append(append(b, 0), method...)
	b = append(append(b, 0), host...)
	b = append(append(b, 0), uri...)
	if vs := r.Header[CallerHeader]; len(vs) > 0 {
		b = append(append(b, 0), vs[0]...)
	}
	m.buf = append(b, 0)
	m.h.Reset()
	m.h.Write(m.buf)
	m.sum = m.h.Sum(m.sum[:0])
	return append(dst, m.sum...)
}

// macState is a keyed HMAC-SHA256 hash with its buffers, kept in
// Cluster.macs between requests.
type macState struct {
	h   hash.Hash
	buf []byte
	sum []byte
}
