package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Header names of a delivery.
const (
	HeaderDelivery  = "Sandwake-Delivery"
	HeaderSignature = "Sandwake-Signature"
)

// Errors of Verify.
var (
	// ErrMalformed: the signature header is not t=<unix>,v1=<hex>.
	ErrMalformed = errors.New("webhook: malformed signature header")
	// ErrMismatch: no v1 signature matches the body and the secret.
	ErrMismatch = errors.New("webhook: signature does not match")
	// ErrTooOld: the signature's timestamp is outside the tolerance (a
	// replay, or clocks far apart).
	ErrTooOld = errors.New("webhook: signature timestamp outside tolerance")
)

func mac(secret []byte, t int64, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(strconv.FormatInt(t, 10)))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Sign returns the Sandwake-Signature header value for body sent at t.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := t.Unix()
	return "t=" + strconv.FormatInt(ts, 10) + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

// Verify checks a Sandwake-Signature header against body and secret, and
// that its timestamp is within tolerance of now (tolerance <= 0: not
// checked). Several v1 values (during a secret rotation) are accepted if one
// matches.
func Verify(secret []byte, header string, body []byte, tolerance time.Duration) error {
	return VerifyAt(secret, header, body, tolerance, time.Now())
}

// VerifyAt is Verify with the current time given.
func VerifyAt(secret []byte, header string, body []byte, tolerance time.Duration, now time.Time) error {
	var (
		ts    int64
		haveT bool
		sigs  [][]byte
	)
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrMalformed
		}
		switch k {
		case "t":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return ErrMalformed
			}
			ts, haveT = n, true
		case "v1":
			b, err := hex.DecodeString(v)
			if err != nil {
				return ErrMalformed
			}
			sigs = append(sigs, b)
		}
	}
	if !haveT || len(sigs) == 0 {
		return ErrMalformed
	}
	if tolerance > 0 {
		if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
			return fmt.Errorf("%w: signed %s ago", ErrTooOld, d.Round(time.Second))
		}
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return nil
		}
	}
	return ErrMismatch
}
