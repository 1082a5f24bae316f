package lifecycle

import (
	"context"
	"testing"
	"time"
)

func TestSlotsBound(t *testing.T) {
	a := &Activity{clock: time.Now}
	var held []*Slots
	for range 3 {
		s := a.TakeSlot(3)
		if s == nil {
			t.Fatal("a free slot was not taken")
		}
		held = append(held, s)
	}
	if a.TakeSlot(3) != nil {
		t.Fatal("a fourth slot was taken with a bound of 3")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := a.WaitSlot(ctx, 3); err == nil {
		t.Fatal("a slot was given while all were held")
	}

	// A waiter is served by the first slot released.
	got := make(chan *Slots)
	go func() {
		s, err := a.WaitSlot(context.Background(), 3)
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	held[0].Release()
	w := <-got
	if a.TakeSlot(3) != nil {
		t.Fatal("a slot was taken beyond the bound after a hand-over")
	}
	w.Release()
	s := a.TakeSlot(3)
	if s == nil {
		t.Fatal("a released slot was not free again")
	}

	// A new bound (a reload) makes a new set; the old one still takes
	// its releases.
	fresh := a.TakeSlot(5)
	if fresh == nil || fresh == s {
		t.Fatal("a new bound did not make a new set of slots")
	}
	for _, h := range append(held[1:], s, fresh) {
		h.Release()
	}
}
