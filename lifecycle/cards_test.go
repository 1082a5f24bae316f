package lifecycle_test

import (
	"context"
	"testing"

	"github.com/sandwake/sandwake/lifecycle"
)

// TestCardsRideTheActivityFlush: a card is kept in memory (no store
// write) until the activity flush writes it into the record, from which a
// manager started afresh over the store reads it; an unchanged card is
// not written again.
func TestCardsRideTheActivityFlush(t *testing.T) {
	env := newTestEnv(t, lifecycle.Config{})
	rec, err := env.m.Create(context.Background(), lifecycle.CreateRequest{ID: "card", Spec: testSpec()})
	if err != nil {
		t.Fatal(err)
	}
	c := lifecycle.Card{Title: "T", Meta: [][2]string{{"og:title", "O"}}}
	env.m.SetCard(rec.ID, 8080, c)
	stored, _ := env.st.Get(rec.ID)
	if len(stored.Cards) != 0 {
		t.Fatalf("a card was written on SetCard: %+v", stored.Cards)
	}
	if got, ok := env.m.Card(rec.ID, 8080); !ok || !got.Equal(c) {
		t.Fatalf("pending card: %+v %v", got, ok)
	}
	if err := env.m.FlushActivity(); err != nil {
		t.Fatal(err)
	}
	stored, _ = env.st.Get(rec.ID)
	if got := stored.Cards[8080]; !got.Equal(c) {
		t.Fatalf("after the flush the record holds %+v", stored.Cards)
	}
	env.m.SetCard(rec.ID, 8080, lifecycle.Card{Title: "T", Meta: [][2]string{{"og:title", "O"}}})
	if n := env.m.PendingCards(); n != 0 {
		t.Errorf("an unchanged card waits to be written again (%d pending)", n)
	}
	fresh, err := lifecycle.NewManager(env.st, env.rt, lifecycle.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if got, ok := fresh.Card(rec.ID, 8080); !ok || !got.Equal(c) {
		t.Fatalf("a manager over the same store reads %+v %v", got, ok)
	}
	// A manager started afresh compares a page's card with the record's.
	fresh.SetCard(rec.ID, 8080, c)
	if n := fresh.PendingCards(); n != 0 {
		t.Errorf("a fresh manager would write the record's own card again (%d pending)", n)
	}
	fresh.SetCard(rec.ID, 8080, lifecycle.Card{Title: "T2"})
	if n := fresh.PendingCards(); n != 1 {
		t.Errorf("a changed card: %d pending, want 1", n)
	}
	// A destroyed sandbox's cards are forgotten.
	if err := fresh.Destroy(context.Background(), rec.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if n := fresh.PendingCards(); n != 0 {
		t.Errorf("a destroyed sandbox's card still waits (%d pending)", n)
	}
	if _, ok := fresh.Card(rec.ID, 8080); ok {
		t.Errorf("a destroyed sandbox still has a card")
	}
}
