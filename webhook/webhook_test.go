package webhook

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	secret := []byte("s3cret")
	body := []byte(`{"id":7,"type":"sandbox.running"}`)
	now := time.Unix(1_800_000_000, 0)
	header := Sign(secret, now, body)
	if !strings.HasPrefix(header, "t=1800000000,v1=") {
		t.Fatalf("header %q", header)
	}
	tests := []struct {
		name   string
		secret []byte
		header string
		body   []byte
		now    time.Time
		want   error
	}{
		{"valid", secret, header, body, now, nil},
		{"valid within tolerance", secret, header, body, now.Add(4 * time.Minute), nil},
		{"tampered body", secret, header, []byte(`{"id":7,"type":"sandbox.killed"}`), now, ErrMismatch},
		{"wrong secret", []byte("other"), header, body, now, ErrMismatch},
		{"old timestamp", secret, header, body, now.Add(6 * time.Minute), ErrTooOld},
		{"future timestamp", secret, header, body, now.Add(-6 * time.Minute), ErrTooOld},
		{"rotated: second v1 matches", secret, "t=1800000000,v1=00ff," + strings.Split(header, ",")[1], body, now, nil},
		{"no v1", secret, "t=1800000000", body, now, ErrMalformed},
		{"no t", secret, strings.Split(header, ",")[1], body, now, ErrMalformed},
		{"garbage", secret, "hello", body, now, ErrMalformed},
		{"bad hex", secret, "t=1800000000,v1=zz", body, now, ErrMalformed},
		{"empty", secret, "", body, now, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifyAt(tt.secret, tt.header, tt.body, 5*time.Minute, tt.now)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	// The timestamp is part of what is signed: moving it breaks the match.
	moved := strings.Replace(header, "t=1800000000", "t=1800000001", 1)
	if err := VerifyAt(secret, moved, body, 0, now); !errors.Is(err, ErrMismatch) {
		t.Fatalf("moved timestamp: %v", err)
	}
}
