package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStoreDirectoryMustBePrivate: a directory Open makes is 0700, and so
// is an empty one it is given; one holding files that group or others can
// read (0755, as a bind mount often is) is refused naming the path, the
// mode and the fix, and nothing in it changes; once it is 0700 the store
// opens and no file in it is left readable by others, even one that was.
func TestStoreDirectoryMustBePrivate(t *testing.T) {
	made := filepath.Join(t.TempDir(), "made")
	st, err := Open(Options{Dir: made})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if fi, err := os.Stat(made); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("a directory the store made: %v %v, want 0700", fi.Mode(), err)
	}

	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(empty, 0o755) // whatever the umask
	st, err = Open(Options{Dir: empty})
	if err != nil {
		t.Fatalf("open on an empty 0755 directory: %v, want it made private and used", err)
	}
	st.Close()
	if fi, err := os.Stat(empty); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("an empty directory the store took: %v %v, want 0700", fi.Mode(), err)
	}

	// A directory with files in it (a store, a bind mount's content)
	// open to others is refused.
	open := filepath.Join(t.TempDir(), "open")
	st, err = Open(Options{Dir: open})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	before, _ := os.ReadDir(open)
	os.Chmod(open, 0o755)
	_, err = Open(Options{Dir: open})
	if !errors.Is(err, ErrNotPrivate) || !strings.Contains(err.Error(), open) || !strings.Contains(err.Error(), "chmod 700") || !strings.Contains(err.Error(), "0755") {
		t.Fatalf("open on a 0755 directory: %v, want ErrNotPrivate naming the path, the mode and the fix", err)
	}
	if after, _ := os.ReadDir(open); len(after) != len(before) {
		t.Fatalf("the refused open changed the directory: %d files, then %d", len(before), len(after))
	}

	// A store whose files were readable by others (an older sandwake, a
	// copy): opened once the directory is private, the files are too.
	if err := os.Chmod(open, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err = Open(Options{Dir: open})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	entries, _ := os.ReadDir(open)
	for _, e := range entries {
		os.Chmod(filepath.Join(open, e.Name()), 0o644)
	}
	st, err = Open(Options{Dir: open})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	entries, _ = os.ReadDir(open)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && e.Type().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is %04o after open, want no group or other bits", e.Name(), fi.Mode().Perm())
		}
	}
}
