package store

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/sandwake/sandwake/lifecycle"
)

func openMem(t *testing.T, opts Options) *Store {
	t.Helper()
	opts.InMemory = true
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newRecord(id string, state lifecycle.State) lifecycle.Record {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d := 90 * time.Second
	return lifecycle.Record{
		ID:         id,
		Spec:       lifecycle.Spec{Image: "img:1", Ports: []int{8080, 9000}, Env: map[string]string{"A": "b"}, IdlePause: &d, WorkspacePath: "/workspace"},
		State:      state,
		CreatedAt:  now,
		StateSince: now,
		Upstreams:  map[int]string{8080: "127.0.0.1:40000"},
	}
}

func TestTransitionTable(t *testing.T) {
	tests := []struct {
		name    string
		from    []lifecycle.State
		wantErr error
		want    lifecycle.State
	}{
		{"allowed", []lifecycle.State{"running"}, nil, "paused"},
		{"one of several", []lifecycle.State{"stopped", "running"}, nil, "paused"},
		{"refused", []lifecycle.State{"stopped"}, lifecycle.ErrConflict, "running"},
		{"none allowed", nil, lifecycle.ErrConflict, "running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openMem(t, Options{})
			if _, _, err := s.Create(newRecord("a1", "running"), "created"); err != nil {
				t.Fatal(err)
			}
			_, ev, err := s.Transition("a1", tt.from, "paused", "idle", nil)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			got, _ := s.Get("a1")
			if got.State != tt.want {
				t.Fatalf("state = %s, want %s", got.State, tt.want)
			}
			evs, _ := s.EventsAfter(0, 0)
			wantEvents := 1
			if tt.wantErr == nil {
				wantEvents = 2
				if ev.From != "running" || ev.To != "paused" || ev.Type != "sandbox.paused" || ev.Reason != "idle" {
					t.Fatalf("event = %+v", ev)
				}
			} else {
				var se *StateError
				if !errors.As(err, &se) || se.Current != "running" {
					t.Fatalf("want StateError with current state, got %v", err)
				}
			}
			if len(evs) != wantEvents {
				t.Fatalf("events = %d, want %d", len(evs), wantEvents)
			}
		})
	}
}

func TestMutateErrorWritesNothing(t *testing.T) {
	s := openMem(t, Options{})
	s.Create(newRecord("a1", "stopped"), "")
	boom := errors.New("boom")
	_, _, err := s.Transition("a1", []lifecycle.State{"stopped"}, "running", "", func(r *lifecycle.Record) error {
		r.ContainerID = "changed"
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	got, _ := s.Get("a1")
	if got.State != "stopped" || got.ContainerID != "" {
		t.Fatalf("record changed: %+v", got)
	}
	if last, _ := s.LastEventID(); last != 1 {
		t.Fatalf("last event = %d, want 1", last)
	}
	// The failed write did not burn an id.
	_, ev, err := s.Transition("a1", []lifecycle.State{"stopped"}, "running", "", nil)
	if err != nil || ev.ID != 2 {
		t.Fatalf("next event id = %d (%v), want 2", ev.ID, err)
	}
}

func TestCreateExistsAndNotFound(t *testing.T) {
	s := openMem(t, Options{})
	if _, _, err := s.Create(newRecord("a1", "creating"), ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Create(newRecord("a1", "creating"), ""); !errors.Is(err, lifecycle.ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	if _, err := s.Get("nope"); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("get: %v", err)
	}
	if _, _, err := s.Transition("nope", []lifecycle.State{"running"}, "paused", "", nil); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("transition: %v", err)
	}
	if _, err := s.Delete("nope", lifecycle.EventDestroyed, ""); !errors.Is(err, lifecycle.ErrNotFound) {
		t.Fatalf("delete: %v", err)
	}
}

func TestConcurrentTransitionsGetDenseOrderedIDs(t *testing.T) {
	s := openMem(t, Options{})
	const n = 50
	for i := range n {
		s.Create(newRecord(fmt.Sprintf("s%d", i), "running"), "")
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("s%d", i)
			if _, _, err := s.Transition(id, []lifecycle.State{"running"}, "paused", "", nil); err != nil {
				t.Error(err)
			}
			if _, _, err := s.Transition(id, []lifecycle.State{"paused"}, "stopped", "", nil); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	evs, err := s.EventsAfter(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3*n {
		t.Fatalf("events = %d, want %d", len(evs), 3*n)
	}
	for i, ev := range evs {
		if ev.ID != uint64(i+1) {
			t.Fatalf("event %d has id %d", i, ev.ID)
		}
	}
	h, _ := s.History("s7")
	if len(h) != 3 || h[0].To != "running" || h[1].To != "paused" || h[2].To != "stopped" {
		t.Fatalf("history = %+v", h)
	}
	page, _ := s.EventsAfter(10, 5)
	if len(page) != 5 || page[0].ID != 11 {
		t.Fatalf("page = %+v", page)
	}
}

func TestReopenGivesBackExactlyWhatWasWritten(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	s.Create(newRecord("a1", "running"), "created")
	s.Create(newRecord("b2", "stopped"), "created")
	s.Transition("a1", []lifecycle.State{"running"}, "paused", "idle", func(r *lifecycle.Record) error { r.ContainerID = "c1"; return nil })
	s.Delete("b2", lifecycle.EventDestroyed, "api")
	recs1, _ := s.List(nil)
	evs1, _ := s.EventsAfter(0, 0)
	hist1, _ := s.History("b2")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	recs2, _ := s2.List(nil)
	evs2, _ := s2.EventsAfter(0, 0)
	hist2, _ := s2.History("b2")
	if !reflect.DeepEqual(recs1, recs2) || len(recs2) != 1 {
		t.Fatalf("records differ:\n%+v\n%+v", recs1, recs2)
	}
	if !reflect.DeepEqual(evs1, evs2) || len(evs2) != 4 {
		t.Fatalf("events differ:\n%+v\n%+v", evs1, evs2)
	}
	if !reflect.DeepEqual(hist1, hist2) || len(hist2) != 2 {
		t.Fatalf("history differs")
	}
	_, ev, err := s2.Transition("a1", []lifecycle.State{"paused"}, "running", "wake", nil)
	if err != nil || ev.ID != 5 {
		t.Fatalf("id after reopen = %d (%v), want 5", ev.ID, err)
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o700) // a store directory must be private
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(txn *badger.Txn) error { return txn.Set(keySchema, []byte("99")) })
	db.Close()
	_, err = Open(Options{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "schema version 99") {
		t.Fatalf("err = %v", err)
	}
}

func TestClosedStoreRefusesWrites(t *testing.T) {
	s, err := Open(Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, _, err := s.Create(newRecord("a", "running"), ""); !errors.Is(err, ErrClosed) {
		t.Fatalf("err = %v", err)
	}
}

func TestUpdateAndUpdateMany(t *testing.T) {
	s := openMem(t, Options{})
	s.Create(newRecord("a", "running"), "")
	s.Create(newRecord("b", "running"), "")
	if _, err := s.Update("a", func(r *lifecycle.Record) error { r.State = "paused"; return nil }); err == nil {
		t.Fatal("update changed state")
	}
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.UpdateMany([]string{"a", "gone", "b"}, func(r *lifecycle.Record) { r.LastActiveAt = at }); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		r, _ := s.Get(id)
		if !r.LastActiveAt.Equal(at) || r.State != "running" {
			t.Fatalf("%s: %+v", id, r)
		}
	}
	if last, _ := s.LastEventID(); last != 2 {
		t.Fatalf("updates wrote events: last id %d", last)
	}
}

func TestOutboxWrittenWithEvent(t *testing.T) {
	s := openMem(t, Options{OutboxTargets: func(ev lifecycle.Event) []string {
		if ev.Type == "sandbox.killed" {
			return []string{"hookA", "hookB"}
		}
		return []string{"hookA"}
	}})
	s.Create(newRecord("a", "running"), "")
	s.Transition("a", []lifecycle.State{"running"}, "killed", "gone", nil)
	a, _ := s.OutboxPending("hookA", 0)
	b, _ := s.OutboxPending("hookB", 0)
	if len(a) != 2 || len(b) != 1 || b[0].Type != "sandbox.killed" {
		t.Fatalf("outbox a=%+v b=%+v", a, b)
	}
	if err := s.OutboxAck("hookA", a[0].ID); err != nil {
		t.Fatal(err)
	}
	a, _ = s.OutboxPending("hookA", 0)
	if len(a) != 1 || a[0].ID != 2 {
		t.Fatalf("after ack: %+v", a)
	}
}
