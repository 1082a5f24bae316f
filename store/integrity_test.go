package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fill opens a store in dir, writes n records and closes it, so that its
// tables are on disk.
func fill(t *testing.T, dir string, n int) {
	t.Helper()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, _, err := s.Create(newRecord("r"+string(rune('a'+i)), "running"), "create"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestDamagedStoreRefusesToOpen(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
		names  string // what the error must name
	}{
		{"manifest truncated", func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, "MANIFEST"), 10); err != nil {
				t.Fatal(err)
			}
		}, "MANIFEST"},
		{"manifest emptied", func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, "MANIFEST"), 0); err != nil {
				t.Fatal(err)
			}
		}, "MANIFEST"},
		{"manifest removed", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "MANIFEST")); err != nil {
				t.Fatal(err)
			}
		}, "MANIFEST"},
		{"every data file removed", func(t *testing.T, dir string) {
			for _, pat := range []string{"*.sst", "*.vlog", "*.mem", "MANIFEST", "KEYREGISTRY", "DISCARD"} {
				files, _ := filepath.Glob(filepath.Join(dir, pat))
				for _, f := range files {
					os.Remove(f)
				}
			}
		}, "MANIFEST"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			fill(t, dir, 3)
			tt.damage(t, dir)
			before := listing(t, dir)
			s, err := Open(Options{Dir: dir})
			if err == nil {
				recs, _ := s.List(nil)
				s.Close()
				t.Fatalf("a damaged store opened (with %d records); want ErrDamaged", len(recs))
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), tt.names) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("error %q: want ErrDamaged naming %s and the directory", err, tt.names)
			}
			if after := listing(t, dir); after != before {
				t.Fatalf("a refused open changed the directory:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// listing describes dir's files and sizes.
func listing(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range ents {
		fi, _ := e.Info()
		fmt.Fprintf(&b, "%s:%d ", e.Name(), fi.Size())
	}
	return b.String()
}

func TestIntactStoreReopensAndIsNotFresh(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Fresh() {
		t.Fatal("a new store is not fresh")
	}
	s.Close()
	fill(t, dir, 2)
	s, err = Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Fresh() {
		t.Fatal("a reopened store says it is fresh")
	}
	if recs, _ := s.List(nil); len(recs) != 2 {
		t.Fatalf("%d records after reopen, want 2", len(recs))
	}
}

func TestInstanceKeptAndMismatchRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	gen := func() string { return "generated1" }
	name, err := s.Instance("", gen)
	if err != nil || name != "generated1" {
		t.Fatalf("first Instance = %q, %v", name, err)
	}
	if name, err = s.Instance("", func() string { return "other" }); err != nil || name != "generated1" {
		t.Fatalf("second Instance = %q, %v: want the kept name", name, err)
	}
	if name, err = s.Instance("generated1", gen); err != nil || name != "generated1" {
		t.Fatalf("Instance with the kept name configured = %q, %v", name, err)
	}
	s.Close()
	s, err = Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Instance("staging", gen)
	if !errors.Is(err, ErrInstanceMismatch) || !strings.Contains(err.Error(), `"generated1"`) || !strings.Contains(err.Error(), `"staging"`) {
		t.Fatalf("a different configured name: %v; want ErrInstanceMismatch naming both", err)
	}
}
