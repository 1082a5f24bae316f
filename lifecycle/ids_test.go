package lifecycle

import (
	"strings"
	"testing"
	"time"
)

func TestValidID(t *testing.T) {
	tests := []struct {
		id   string
		want bool
	}{
		{"", false},
		{"a", true},
		{"0", true},
		{"app1", true},
		{"01hzy3k5q8r9s0t1v2w3x4y5z6", true},
		{strings.Repeat("a", MaxIDLen), true},
		{strings.Repeat("a", MaxIDLen+1), false},
		{"App1", false},
		{"APP", false},
		{"my-app", false},
		{"my_app", false},
		{"my.app", false},
		{"my app", false},
		{" app", false},
		{"app/1", false},
		{"appé", false},
		{"app\x00", false},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			if got := ValidID(tt.id); got != tt.want {
				t.Fatalf("ValidID(%q) = %v, want %v", tt.id, got, tt.want)
			}
		})
	}
}

// decodeMillis reads the timestamp of a ULID back from its first 10 digits
// (2 padding bits and 48 bits of milliseconds).
func decodeMillis(t *testing.T, id string) int64 {
	t.Helper()
	var v int64
	for _, c := range id[:10] {
		d := strings.IndexRune(crockford, c)
		if d < 0 {
			t.Fatalf("%q: %q is not a crockford digit", id, c)
		}
		v = v<<5 | int64(d)
	}
	return v
}

func TestNewID(t *testing.T) {
	times := []time.Time{
		time.UnixMilli(0),
		time.UnixMilli(1),
		time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 7e6, time.UTC),
		time.Date(2099, 12, 31, 23, 59, 59, 999e6, time.UTC),
		time.UnixMilli(1<<48 - 1), // the last millisecond a ULID holds
	}
	var prev string
	for i, tm := range times {
		id := NewID(tm)
		if len(id) != 26 || !ValidID(id) {
			t.Fatalf("NewID(%v) = %q, want 26 characters of [0-9a-z]", tm, id)
		}
		if got := decodeMillis(t, id); got != tm.UnixMilli() {
			t.Fatalf("NewID(%v) = %q encodes %d ms, want %d", tm, id, got, tm.UnixMilli())
		}
		if i > 0 && id <= prev {
			t.Fatalf("NewID(%v) = %q does not sort after %q", tm, id, prev)
		}
		prev = id
	}
}

func TestNewIDSortsByTime(t *testing.T) {
	base := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	for i := range 1000 {
		a := NewID(base.Add(time.Duration(i) * time.Millisecond))
		b := NewID(base.Add(time.Duration(i+1) * time.Millisecond))
		if a >= b {
			t.Fatalf("id of ms %d (%s) does not sort before id of ms %d (%s)", i, a, i+1, b)
		}
	}
}

func TestNewIDUnique(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	seen := make(map[string]bool)
	for range 10000 {
		id := NewID(now)
		if seen[id] {
			t.Fatalf("NewID returned %s twice in one millisecond", id)
		}
		seen[id] = true
		if id[:10] != NewID(now)[:10] {
			t.Fatalf("ids of the same millisecond differ in their time digits")
		}
	}
}
