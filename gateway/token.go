package gateway

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
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
	TokenPrefix     = "swt_"
	TokenQueryParam = "sandwake_token"
	TokenCookie     = "sandwake_token"
	// TokenCookieHost is the cookie's name for a visitor on https: the
	// __Host- prefix makes browsers refuse it unless it is Secure, for
	// this host only (no Domain) and for every path, so that a sibling
	// preview cannot plant or shadow it.
	TokenCookieHost = "__Host-" + TokenCookie
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

// SignToken makes a preview token for incarnation inc of sandbox id.
func SignToken(secret []byte, id, inc string, gen uint64, exp time.Time, subject string) string {
	payload := tokenVersion + "|" + id + "|" + strconv.FormatUint(gen, 10) + "|" + strconv.FormatInt(exp.Unix(), 10) + "|" + subject
	enc := base64.RawURLEncoding
	return TokenPrefix + enc.EncodeToString([]byte(payload)) + "." + enc.EncodeToString(tokenMAC(secret, payload, inc))
}

// VerifyToken checks a token for incarnation inc of sandbox id at generation
// gen.
func VerifyToken(secret []byte, token, id, inc string, gen uint64, now time.Time) error {
	if token == "" {
		return errTokenMissing
	}
	body, ok := strings.CutPrefix(token, TokenPrefix)
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

// BearerCredentials returns the credentials of an Authorization value using
// the Bearer scheme. Auth schemes are case-insensitive (RFC 7235 §2.1), and
// one or more spaces separate the scheme from the credentials.
func BearerCredentials(authorization string) (string, bool) {
	scheme, rest, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.Trim(rest, " \t"), true
}

// PreviewBearer reports whether an Authorization value carries a sandwake
// preview token, and returns it.
func PreviewBearer(authorization string) (string, bool) {
	b, ok := BearerCredentials(authorization)
	if !ok || !strings.HasPrefix(b, TokenPrefix) {
		return "", false
	}
	return b, true
}

// TokenExpiry reads the expiry of an already verified token.
func TokenExpiry(token string) time.Time {
	body := strings.TrimPrefix(token, TokenPrefix)
	p64, _, _ := strings.Cut(body, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(p64)
	parts := strings.SplitN(string(payload), "|", 5)
	if len(parts) < 4 {
		return time.Time{}
	}
	exp, _ := strconv.ParseInt(parts[3], 10, 64)
	return time.Unix(exp, 0)
}
