package gateway

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWakeRateCountsWakesNotRequests: the cap limits how many sandboxes start
// waking per second; any number of requests joining one wake take nothing.
func TestWakeRateCountsWakesNotRequests(t *testing.T) {
	g := NewWakeGuard()
	g.Configure(nil, 1, 3)       // 1 wake/s, burst 3
	clients := NewClientLimits() // no per-client cap
	one := netip.MustParsePrefix("127.0.0.1/32")
	allowWake := func(id string, now time.Time) bool { return g.AllowWake(id, clients, one, now) == wakeAllowed }
	now := time.Unix(1_800_000_000, 0)
	for i := range 500 {
		if !allowWake("storm", now) {
			t.Fatalf("request %d for a wake already admitted was refused", i)
		}
	}
	allowed := 0
	for i := range 10 {
		if allowWake(fmt.Sprintf("other%d", i), now) {
			allowed++
		}
	}
	if allowed != 2 { // burst 3, one taken by "storm"
		t.Fatalf("%d other wakes allowed at once, want 2", allowed)
	}
	if !allowWake("late", now.Add(time.Second)) {
		t.Fatal("a wake one second later was refused (the rate refills)")
	}
	// A failure ends the admission: the next try counts again.
	g.failed("storm", now)
	if off, left := g.BackingOff("storm", now); !off || left != wakeBackoffBase {
		t.Fatalf("backoff after a failure: %v %s", off, left)
	}
	g.Reset("storm")
	if off, _ := g.BackingOff("storm", now); off {
		t.Fatal("reset left the backoff")
	}
}

// signTokenV1 makes a token as sandwake did before incarnations: payload
// "v1|…", signed over the payload alone.
func signTokenV1(secret []byte, id string, gen uint64, exp time.Time, subject string) string {
	payload := "v1|" + id + "|" + strconv.FormatUint(gen, 10) + "|" + strconv.FormatInt(exp.Unix(), 10) + "|" + subject
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(payload))
	enc := base64.RawURLEncoding
	return TokenPrefix + enc.EncodeToString([]byte(payload)) + "." + enc.EncodeToString(h.Sum(nil))
}

func TestTokenRoundTrip(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_800_000_000, 0)
	const inc = "0123456789abcdef"
	tok := SignToken(secret, "abc", inc, 3, now.Add(time.Hour), "rev@example.com")
	legacy := SignToken(secret, "abc", "", 3, now.Add(time.Hour), "")
	v1 := signTokenV1(secret, "abc", 3, now.Add(time.Hour), "old")
	tests := []struct {
		name  string
		token string
		id    string
		inc   string
		gen   uint64
		now   time.Time
		want  error
	}{
		{"valid", tok, "abc", inc, 3, now, nil},
		{"other sandbox", tok, "abd", inc, 3, now, errTokenOther},
		{"other sandbox, other incarnation", tok, "abd", "fedcba9876543210", 0, now, errTokenOther},
		{"revoked", tok, "abc", inc, 4, now, errTokenRevoked},
		{"expired", tok, "abc", inc, 3, now.Add(time.Hour), errTokenExpired},
		{"missing", "", "abc", inc, 3, now, errTokenMissing},
		{"not ours", "Bearer-xyz", "abc", inc, 3, now, errTokenMalformed},
		{"tampered", tok[:len(tok)-2] + "AA", "abc", inc, 3, now, errTokenInvalid},
		{"other secret", SignToken([]byte("another-secret-of-enough-length"), "abc", inc, 3, now.Add(time.Hour), ""), "abc", inc, 3, now, errTokenInvalid},
		// A sandbox destroyed and created again under the same id: same
		// generation, new incarnation.
		{"earlier incarnation", tok, "abc", "fedcba9876543210", 3, now, errTokenInvalid},
		{"minted without incarnation, sandbox has one", legacy, "abc", inc, 3, now, errTokenInvalid},
		{"minted with incarnation, record has none", tok, "abc", "", 3, now, errTokenInvalid},
		// Records made before incarnations keep working, with tokens
		// minted now and with tokens minted before (v1).
		{"record without incarnation", legacy, "abc", "", 3, now, nil},
		{"v1 token, record without incarnation", v1, "abc", "", 3, now, nil},
		{"v1 token, revoked", v1, "abc", "", 4, now, errTokenRevoked},
		{"v1 token, sandbox with an incarnation", v1, "abc", inc, 3, now, errTokenInvalid},
		{"unknown version", forgeVersion(secret, "v9|abc|3|1800003600|", inc), "abc", inc, 3, now, errTokenInvalid},
		{"garbage payload", "swt_abc.def", "abc", inc, 3, now, errTokenInvalid},
	}
	for _, tt := range tests {
		if err := VerifyToken(secret, tt.token, tt.id, tt.inc, tt.gen, tt.now); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	if exp := TokenExpiry(tok); !exp.Equal(now.Add(time.Hour)) {
		t.Fatalf("expiry %s", exp)
	}
	// The token does not carry the incarnation, and stays as short as a
	// v1 token.
	for _, part := range strings.Split(strings.TrimPrefix(tok, TokenPrefix), ".") {
		raw, _ := base64.RawURLEncoding.DecodeString(part)
		if strings.Contains(string(raw), inc) || strings.Contains(part, inc) {
			t.Errorf("token part %q carries the incarnation", part)
		}
	}
	if len(tok) != len(signTokenV1(secret, "abc", 3, now.Add(time.Hour), "rev@example.com")) {
		t.Errorf("token of %d bytes, a v1 token was %d", len(tok), len(signTokenV1(secret, "abc", 3, now.Add(time.Hour), "rev@example.com")))
	}
}

// forgeVersion signs an arbitrary payload the way v2 tokens are signed.
func forgeVersion(secret []byte, payload, inc string) string {
	enc := base64.RawURLEncoding
	return TokenPrefix + enc.EncodeToString([]byte(payload)) + "." + enc.EncodeToString(tokenMAC(secret, payload, inc))
}

func TestBearerCredentials(t *testing.T) {
	tests := []struct {
		header  string
		want    string
		ok      bool
		preview bool
	}{
		{"Bearer swt_abc.def", "swt_abc.def", true, true},
		{"bearer swt_abc.def", "swt_abc.def", true, true},
		{"BEARER swt_abc.def", "swt_abc.def", true, true},
		{"bEaReR   swt_abc.def", "swt_abc.def", true, true},
		{"Bearer test-token", "test-token", true, false},
		{"Basic dXNlcjpwYXNz", "", false, false},
		{"Bearerswt_abc", "", false, false},
		{"Bearer", "", false, false},
		{"", "", false, false},
		{"Token swt_abc.def", "", false, false},
	}
	for _, tt := range tests {
		got, ok := BearerCredentials(tt.header)
		if got != tt.want || ok != tt.ok {
			t.Errorf("bearerCredentials(%q) = %q, %v; want %q, %v", tt.header, got, ok, tt.want, tt.ok)
		}
		if _, ok := PreviewBearer(tt.header); ok != tt.preview {
			t.Errorf("previewBearer(%q) = %v, want %v", tt.header, ok, tt.preview)
		}
	}
}

// TestClientBudgetsAreSeparate: each client address has its own wake
// budget and its own held-request cap; a wake the global rate refuses
// gives the client's token back; a release frees its place once.
func TestClientBudgetsAreSeparate(t *testing.T) {
	g := NewWakeGuard()
	g.Configure(nil, 100, 100)
	clients := NewClientLimits()
	clients.Configure(1, 2, 2) // 1 wake/s per client, burst 2; 2 held
	a, b := netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("127.0.0.2/32")
	now := time.Unix(1_800_000_000, 0)
	for i := range 2 {
		if got := g.AllowWake(fmt.Sprintf("a%d", i), clients, a, now); got != wakeAllowed {
			t.Fatalf("client a's wake %d: %d, want allowed", i, got)
		}
	}
	if got := g.AllowWake("a2", clients, a, now); got != WakeRefusedClient {
		t.Fatalf("client a's third wake at once: %d, want refused by its own budget", got)
	}
	if got := g.AllowWake("b0", clients, b, now); got != wakeAllowed {
		t.Fatalf("client b's first wake: %d, want allowed (a's budget is a's)", got)
	}
	// The global rate refusing a wake gives the client's token back.
	g.Configure(nil, 0.001, 1)
	g.limiter.AllowN(now, 1) // spend the global burst
	c := netip.MustParsePrefix("127.0.0.3/32")
	clients.Configure(1, 1, 2)
	if got := g.AllowWake("c0", clients, c, now); got != WakeRefusedGlobal {
		t.Fatalf("c's wake with the global budget spent: %d, want refused globally", got)
	}
	g.Configure(nil, 100, 100)
	if got := g.AllowWake("c1", clients, c, now); got != wakeAllowed {
		t.Fatalf("c's wake after a global refusal: %d, want allowed (its token was given back)", got)
	}

	var releases []func()
	for i := range 2 {
		ok, release := clients.Hold(a)
		if !ok {
			t.Fatalf("client a's held request %d refused", i)
		}
		releases = append(releases, release)
	}
	if ok, _ := clients.Hold(a); ok {
		t.Fatal("client a's third held request was let in")
	}
	if ok, release := clients.Hold(b); !ok {
		t.Fatal("client b's held request refused because of a's")
	} else {
		release()
	}
	releases[0]()
	releases[0]() // twice: frees one place only
	if ok, release := clients.Hold(a); !ok {
		t.Fatal("client a's place was not freed")
	} else {
		defer release()
	}
	if ok, _ := clients.Hold(a); ok {
		t.Fatal("a double release freed two places")
	}
}
