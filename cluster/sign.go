package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ForwardHeader carries the signature of a node-to-node request.
const ForwardHeader = "Sandwake-Forwarded"

// maxSkew is how old (or how far in the future) a signature may be.
const maxSkew = time.Minute

// Sign marks r as forwarded by this node: ForwardHeader set to
// "<node>;<unix seconds>;<hex hmac>" over node, time, method, host and
// request URI with the cluster secret.
func (c *Cluster) Sign(r *http.Request) {
	ts := strconv.FormatInt(c.now().Unix(), 10)
	mac := c.mac(c.cfg.Node, ts, r)
	r.Header.Set(ForwardHeader, c.cfg.Node+";"+ts+";"+hex.EncodeToString(mac))
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
	parts := strings.Split(vals[0], ";")
	if len(parts) != 3 || parts[0] == "" {
		return "", false, fmt.Errorf("%w: %s is not <node>;<unix seconds>;<hmac>", ErrUnsigned, ForwardHeader)
	}
	node, ts, sig := parts[0], parts[1], parts[2]
	secs, perr := strconv.ParseInt(ts, 10, 64)
	if perr != nil {
		return "", false, fmt.Errorf("%w: bad time %q", ErrUnsigned, ts)
	}
	got, herr := hex.DecodeString(sig)
	if herr != nil {
		return "", false, fmt.Errorf("%w: signature is not hex", ErrUnsigned)
	}
	if !hmac.Equal(got, c.mac(node, ts, r)) {
		return "", false, fmt.Errorf("%w: wrong signature (claimed node %s)", ErrUnsigned, node)
	}
	// Checked after the signature, so the message about time is only
	// given for requests a node really signed.
	if skew := c.now().Sub(time.Unix(secs, 0)); skew > maxSkew || skew < -maxSkew {
		return "", false, fmt.Errorf("%w: signed by node %s %s from now, more than %s", ErrUnsigned, node, skew.Round(time.Second), maxSkew)
	}
	return node, true, nil
}

// mac is the HMAC-SHA256 of a forwarded request's signed fields.
func (c *Cluster) mac(node, ts string, r *http.Request) []byte {
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
	h := hmac.New(sha256.New, c.cfg.Secret)
	for _, f := range []string{node, ts, method, host, uri} {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}
