package caddymodule

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestWakeRateCountsWakesNotRequests: the cap limits how many sandboxes start
// waking per second; any number of requests joining one wake take nothing.
func TestWakeRateCountsWakesNotRequests(t *testing.T) {
	g := newWakeGuard()
	g.configure(nil, 1, 3) // 1 wake/s, burst 3
	now := time.Unix(1_800_000_000, 0)
	for i := range 500 {
		if !g.allowWake("storm", now) {
			t.Fatalf("request %d for a wake already admitted was refused", i)
		}
	}
	allowed := 0
	for i := range 10 {
		if g.allowWake(fmt.Sprintf("other%d", i), now) {
			allowed++
		}
	}
	if allowed != 2 { // burst 3, one taken by "storm"
		t.Fatalf("%d other wakes allowed at once, want 2", allowed)
	}
	if !g.allowWake("late", now.Add(time.Second)) {
		t.Fatal("a wake one second later was refused (the rate refills)")
	}
	// A failure ends the admission: the next try counts again.
	g.failed("storm", now)
	if off, left := g.backingOff("storm", now); !off || left != wakeBackoffBase {
		t.Fatalf("backoff after a failure: %v %s", off, left)
	}
	g.reset("storm")
	if off, _ := g.backingOff("storm", now); off {
		t.Fatal("reset left the backoff")
	}
}

func TestTokenRoundTrip(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_800_000_000, 0)
	tok := signToken(secret, "abc", 3, now.Add(time.Hour), "rev@example.com")
	tests := []struct {
		name  string
		token string
		id    string
		gen   uint64
		now   time.Time
		want  error
	}{
		{"valid", tok, "abc", 3, now, nil},
		{"other sandbox", tok, "abd", 3, now, errTokenOther},
		{"revoked", tok, "abc", 4, now, errTokenRevoked},
		{"expired", tok, "abc", 3, now.Add(time.Hour), errTokenExpired},
		{"missing", "", "abc", 3, now, errTokenMissing},
		{"not ours", "Bearer-xyz", "abc", 3, now, errTokenMalformed},
		{"tampered", tok[:len(tok)-2] + "AA", "abc", 3, now, errTokenInvalid},
		{"other secret", signToken([]byte("another-secret-of-enough-length"), "abc", 3, now.Add(time.Hour), ""), "abc", 3, now, errTokenInvalid},
	}
	for _, tt := range tests {
		if err := verifyToken(secret, tt.token, tt.id, tt.gen, tt.now); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	if exp := tokenExpiry(tok); !exp.Equal(now.Add(time.Hour)) {
		t.Fatalf("expiry %s", exp)
	}
}
