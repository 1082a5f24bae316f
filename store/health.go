package store

import (
	"fmt"
	"syscall"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/sandwake/sandwake/lifecycle"
)

// UnwritableError says why the store cannot take writes, naming its
// directory: it refused a write, or could not commit it, because of its file
// system (free space below the reserve, read-only, I/O errors). Nothing of
// the write was kept; the same write succeeds once the file system is fixed.
// It matches lifecycle.ErrStoreUnavailable with errors.Is and wraps the
// cause (syscall.ENOSPC for free space below the reserve).
type UnwritableError struct {
	// Dir is the store's directory.
	Dir string
	// Problem is what is wrong, in a few words: "no space left (31 MiB
	// free, reserve 64 MiB)".
	Problem string
	// Err is the cause.
	Err error
}

func (e *UnwritableError) Error() string { return fmt.Sprintf("store %s: %s", e.Dir, e.Problem) }

// Is makes errors.Is(err, lifecycle.ErrStoreUnavailable) true.
func (e *UnwritableError) Is(target error) bool { return target == lifecycle.ErrStoreUnavailable }

// Unwrap returns the cause.
func (e *UnwritableError) Unwrap() error { return e.Err }

// keyProbe is what Check writes to learn whether a store that failed a write
// takes writes again.
var keyProbe = []byte("meta/probe")

// Check reports whether the store takes writes now: nil, or an error matching
// lifecycle.ErrStoreUnavailable that says why not. While writes succeed it costs one statfs
// and writes nothing; after a write failed it writes one small key, since
// only a write tells whether a read-only or failing file system recovered.
func (s *Store) Check() error {
	if err := s.checkSpace(); err != nil {
		s.unwritable.Store(err)
		return err
	}
	if s.unwritable.Load() == nil {
		return nil
	}
	return s.write(func(txn *badger.Txn, _ func(lifecycle.Event) (lifecycle.Event, error)) error {
		return txn.Set(keyProbe, []byte(s.now().UTC().Format(time.RFC3339Nano)))
	})
}

// checkSpace refuses a write when the store's file system is nearly full.
func (s *Store) checkSpace() *UnwritableError {
	if s.opts.MinFreeBytes < 0 || (s.opts.InMemory && s.opts.FreeBytes == nil) {
		return nil
	}
	free, err := s.freeBytes()
	if err != nil {
		return nil // cannot tell: let the write decide
	}
	if free < s.opts.MinFreeBytes {
		return &UnwritableError{
			Dir:     s.name(),
			Problem: fmt.Sprintf("no space left (%s free, reserve %s)", sizeText(free), sizeText(s.opts.MinFreeBytes)),
			Err:     syscall.ENOSPC,
		}
	}
	return nil
}

// freeBytes is the free space of the store's file system.
func (s *Store) freeBytes() (int64, error) {
	if s.opts.FreeBytes != nil {
		return s.opts.FreeBytes()
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(s.opts.Dir, &fs); err != nil {
		return 0, err
	}
	return int64(fs.Bavail) * int64(fs.Bsize), nil
}

// commitFailed wraps a failed commit: the file system did not take it.
func (s *Store) commitFailed(err error) *UnwritableError {
	return &UnwritableError{Dir: s.name(), Problem: "write failed: " + err.Error(), Err: err}
}

// name is the store's directory, or what stands for it in memory.
func (s *Store) name() string {
	if s.opts.InMemory {
		return "(in memory)"
	}
	return s.opts.Dir
}

// sizeText writes n bytes in MiB, or KiB below one MiB.
func sizeText(n int64) string {
	if n >= 1<<20 || n <= -1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
