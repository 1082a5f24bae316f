package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	badger "github.com/dgraph-io/badger/v4"
)

// markerFile is written into a store's directory once the store holds a
// schema. Its presence says "this directory held a sandwake store": a later
// open that finds the database empty is then a damaged store, not a new one.
const markerFile = "SANDWAKE"

// ErrDamaged: the store's files are damaged; it is not opened, so that a
// damaged store never serves as an empty one (and nothing is removed on the
// strength of an empty store).
var ErrDamaged = errors.New("store damaged")

// checkIntact runs before Badger opens dir. Badger treats a truncated or
// emptied MANIFEST as a new database and writes new tables over the old
// ones, so the check must come first: a directory that held a store (the
// marker) must still have a MANIFEST that names its tables.
func checkIntact(dir string) error {
	marked := fileExists(filepath.Join(dir, markerFile))
	manifest := filepath.Join(dir, "MANIFEST")
	fi, err := os.Stat(manifest)
	if errors.Is(err, fs.ErrNotExist) {
		if marked {
			return fmt.Errorf("%w: %s is missing (the directory held a sandwake store); restore the directory from a backup or move it away to start with an empty store", ErrDamaged, manifest)
		}
		return nil // a new store
	}
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	f, err := os.Open(manifest)
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	defer f.Close()
	m, _, err := badger.ReplayManifestFile(f, 0, badger.DefaultOptions(dir))
	if err != nil {
		return fmt.Errorf("%w: %s cannot be read (%v); restore the directory from a backup or move it away to start with an empty store", ErrDamaged, manifest, err)
	}
	// Tables on disk that the manifest does not name at all: the manifest
	// lost its content (a crash can leave one unnamed table behind a
	// flush, never every table of a store the manifest knows nothing of).
	if len(m.Tables) == 0 && len(tables) > 0 {
		return fmt.Errorf("%w: %s (%d bytes) names no table but the directory holds %d (%s); restore the directory from a backup or move it away to start with an empty store",
			ErrDamaged, manifest, fi.Size(), len(tables), strings.Join(baseNames(tables), ", "))
	}
	for id := range m.Tables {
		if name := filepath.Join(dir, fmt.Sprintf("%06d.sst", id)); !fileExists(name) {
			return fmt.Errorf("%w: %s names table %s, which is missing", ErrDamaged, manifest, name)
		}
	}
	return nil
}

func baseNames(paths []string) []string {
	out := make([]string, 0, min(len(paths), 5))
	for i, p := range paths {
		if i == 5 {
			out = append(out, "…")
			break
		}
		out = append(out, filepath.Base(p))
	}
	return out
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// writeMarker records that dir holds a store (see markerFile).
func writeMarker(dir string) error {
	p := filepath.Join(dir, markerFile)
	if fileExists(p) {
		return nil
	}
	const text = "This directory is a sandwake store (Badger). Do not edit its files; back it up whole.\n"
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		return fmt.Errorf("opening store: writing %s: %w", p, err)
	}
	return nil
}
