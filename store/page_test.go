package store

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/sandwake/sandwake/lifecycle"
)

// fillRecords writes n records (ids p00000…) in write batches, bypassing the
// synced one-record path, for tests and benchmarks of reads.
func fillRecords(t testing.TB, s *Store, n int, state func(i int) lifecycle.State) []string {
	t.Helper()
	wb := s.db.NewWriteBatch()
	ids := make([]string, n)
	for i := range n {
		r := newRecord(fmt.Sprintf("p%06d", i), state(i))
		ids[i] = r.ID
		if err := wb.SetEntry(badger.NewEntry(recordKey(r.ID), mustEncode(t, &r))); err != nil {
			t.Fatal(err)
		}
	}
	if err := wb.Flush(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func mustEncode(t testing.TB, r *lifecycle.Record) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPage: pages walk the records in id order from a cursor, filtered,
// and never give a record twice, even while records are created and
// deleted between pages.
func TestPage(t *testing.T) {
	s := openMem(t, Options{})
	ids := fillRecords(t, s, 250, func(i int) lifecycle.State {
		if i%3 == 0 {
			return lifecycle.Stopped
		}
		return lifecycle.Running
	})
	var got []string
	after := ""
	for {
		page, err := s.Page(after, 40, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) > 40 {
			t.Fatalf("page of %d, limit 40", len(page))
		}
		for _, r := range page {
			got = append(got, r.ID)
		}
		after = page[len(page)-1].ID
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("pages gave %d ids (first %v), want the %d in order", len(got), got[:min(3, len(got))], len(ids))
	}
	stopped, err := s.Page("p000100", 1000, func(r *lifecycle.Record) bool { return r.State == lifecycle.Stopped })
	if err != nil {
		t.Fatal(err)
	}
	if len(stopped) != 50 || stopped[0].ID != "p000102" {
		t.Fatalf("stopped after p000100: %d, first %s", len(stopped), stopped[0].ID)
	}

	// Creates and deletes while a reader pages: no id twice, and every
	// id that existed from the first page to the last is seen.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := s.Create(newRecord(fmt.Sprintf("q%06d", i), lifecycle.Running), "create"); err != nil {
				t.Error(err)
				return
			}
			if i%2 == 0 {
				if _, err := s.Delete(fmt.Sprintf("p%06d", i%250), lifecycle.EventDestroyed, "test"); err != nil && i < 250 {
					t.Error(err)
					return
				}
			}
		}
	})
	seen := map[string]bool{}
	after = ""
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		page, err := s.Page(after, 7, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, r := range page {
			if seen[r.ID] {
				t.Fatalf("%s on two pages", r.ID)
			}
			seen[r.ID] = true
		}
		after = page[len(page)-1].ID
	}
	close(stop)
	wg.Wait()
	for i := 1; i < 250; i += 2 { // odd ones are never deleted
		if id := fmt.Sprintf("p%06d", i); !seen[id] {
			t.Fatalf("%s existed throughout and was not on any page", id)
		}
	}
}

// BenchmarkPage: the first page of 100 of a store of 100,000 records,
// beside the whole list it replaces.
//
//	go test -run '^$' -bench Page -benchtime 20x ./store/
func BenchmarkPage(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	fillRecords(b, s, 100_000, func(int) lifecycle.State { return lifecycle.Stopped })
	b.Run("first-page-100", func(b *testing.B) {
		for range b.N {
			if page, err := s.Page("", 100, nil); err != nil || len(page) != 100 {
				b.Fatal(len(page), err)
			}
		}
	})
	b.Run("page-100-mid", func(b *testing.B) {
		for range b.N {
			if page, err := s.Page("p050000", 100, nil); err != nil || len(page) != 100 {
				b.Fatal(len(page), err)
			}
		}
	})
	b.Run("full-list", func(b *testing.B) {
		for range b.N {
			if all, err := s.List(nil); err != nil || len(all) != 100_000 {
				b.Fatal(len(all), err)
			}
		}
	})
}
