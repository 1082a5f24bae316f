package store

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrNotPrivate: the store's directory is open to other users of the host.
// The store holds the preview secret and every sandbox's environment.
var ErrNotPrivate = fmt.Errorf("store directory is readable by other users")

// checkPrivate refuses a store directory that group or others may read or
// enter and that already holds files (made 0700 when Open creates it; an
// existing empty one is made 0700 before anything is written to it; one
// with files, a bind mount or a hostPath, is the operator's to fix), and takes
// group and other bits off the files in it: Badger makes some of its
// files 0666 less the umask.
func checkPrivate(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("checking %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading %s: %w", dir, err)
	}
	if mode := fi.Mode().Perm(); mode&0o077 != 0 && len(entries) == 0 {
		// Empty: nothing is exposed yet, and the store is made here now.
		if err := os.Chmod(dir, mode&^0o077); err != nil {
			return fmt.Errorf("making %s private (chmod 700): %w", dir, err)
		}
	} else if mode&0o077 != 0 {
		return fmt.Errorf("%w: %s has mode %04o; it holds the preview secret and every sandbox's env values: run chmod 700 %s "+
			"(for a bind mount or a hostPath volume, set the mode on the host directory, owned by the user sandwake runs as)", ErrNotPrivate, dir, mode, dir)
	}
	return tightenFiles(dir, entries)
}

// tightenFiles takes group and other bits off the regular files among
// entries of dir (nil: read dir).
func tightenFiles(dir string, entries []os.DirEntry) error {
	if entries == nil {
		var err error
		if entries, err = os.ReadDir(dir); err != nil {
			return fmt.Errorf("reading %s: %w", dir, err)
		}
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return fmt.Errorf("checking %s: %w", filepath.Join(dir, e.Name()), err)
		}
		if info.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(filepath.Join(dir, e.Name()), info.Mode().Perm()&^fs.FileMode(0o077)); err != nil {
				return fmt.Errorf("making %s private: %w", filepath.Join(dir, e.Name()), err)
			}
		}
	}
	return nil
}
