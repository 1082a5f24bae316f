package store

import (
	"errors"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sandwake/sandwake/lifecycle"
)

// TestCheckFollowsFreeSpace: below the reserve, every write is refused with
// an error naming the store and the shortage (matching lifecycle.ErrStoreUnavailable and
// ENOSPC) and Check says the same without writing; once space is back, Check
// passes and writes succeed again.
func TestCheckFollowsFreeSpace(t *testing.T) {
	var free atomic.Int64
	free.Store(1 << 30)
	s := openMem(t, Options{MinFreeBytes: 64 << 20, FreeBytes: func() (int64, error) { return free.Load(), nil }})
	if _, _, err := s.Create(newRecord("h1", "running"), "created"); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); err != nil {
		t.Fatalf("Check with space: %v", err)
	}

	free.Store(3 << 20)
	const want = "store (in memory): no space left (3 MiB free, reserve 64 MiB)"
	_, _, err := s.Transition("h1", []lifecycle.State{"running"}, "stopped", "api", nil)
	if !errors.Is(err, lifecycle.ErrStoreUnavailable) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("transition below the reserve: %v, want lifecycle.ErrStoreUnavailable and ENOSPC", err)
	}
	var uerr *UnwritableError
	if !errors.As(err, &uerr) || uerr.Error() != want {
		t.Fatalf("transition below the reserve: %v, want %q", err, want)
	}
	for _, write := range []struct {
		name string
		fn   func() error
	}{
		{"update", func() error { _, err := s.Update("h1", func(*lifecycle.Record) error { return nil }); return err }},
		{"update many", func() error { return s.UpdateMany([]string{"h1"}, func(*lifecycle.Record) {}) }},
		{"delete", func() error { _, err := s.Delete("h1", lifecycle.EventDestroyed, "api"); return err }},
		{"create", func() error { _, _, err := s.Create(newRecord("h2", "running"), "created"); return err }},
	} {
		if err := write.fn(); !errors.Is(err, lifecycle.ErrStoreUnavailable) {
			t.Errorf("%s below the reserve: %v, want lifecycle.ErrStoreUnavailable", write.name, err)
		}
	}
	if err := s.Check(); err == nil || err.Error() != want {
		t.Fatalf("Check below the reserve: %v, want %q", err, want)
	}
	if rec, err := s.Get("h1"); err != nil || rec.State != "running" {
		t.Fatalf("record after refused writes: %+v, %v; want it running as last committed", rec, err)
	}

	free.Store(1 << 30)
	if err := s.Check(); err != nil {
		t.Fatalf("Check once space is back: %v", err)
	}
	if s.unwritable.Load() != nil {
		t.Fatal("Check passed but the store still notes a failed write")
	}
	if _, _, err := s.Transition("h1", []lifecycle.State{"running"}, "stopped", "api", nil); err != nil {
		t.Fatalf("transition once space is back: %v", err)
	}
}
