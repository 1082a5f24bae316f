package lifecycle

import (
	"context"

	"golang.org/x/sync/semaphore"
)

// Slots bounds how many exchanges are open to one sandbox at once (the
// gateway's max_open_per_sandbox). Two things need the bound: an app that
// has just woken must not be sent thousands of held requests at the same
// instant (they are let through as fast as it answers, in arrival order), and
// Docker's userland proxy, one process per published port, drops every
// connection of that port and refuses new ones once it runs out of file
// descriptors (about 10,000 connections with dockerd's usual limit of
// 20,000 descriptors), which no wake repairs until the container restarts.
//
// Waiters are served first in, first out, and a request that arrives while
// others wait queues behind them.
type Slots struct {
	max int64
	sem *semaphore.Weighted
}

// slots returns the sandbox's Slots for a bound of max, replacing a set
// made for another bound (a config reload): exchanges open in the old set
// release into it, so the new bound holds from then on for new ones.
func (a *Activity) slots(max int64) *Slots {
	s := a.lim.Load()
	if s != nil && s.max == max {
		return s
	}
	n := &Slots{max: max, sem: semaphore.NewWeighted(max)}
	if a.lim.CompareAndSwap(s, n) {
		return n
	}
	return a.lim.Load()
}

// TakeSlot takes one of the sandbox's max slots if one is free and nobody is
// waiting for one, else it returns nil. Lock-light and allocation-free: it
// is on the hot path. The caller releases the slot with Release.
func (a *Activity) TakeSlot(max int64) *Slots {
	s := a.slots(max)
	if s.sem.TryAcquire(1) {
		return s
	}
	return nil
}

// WaitSlot waits for one of the sandbox's max slots, in arrival order, until
// ctx ends.
func (a *Activity) WaitSlot(ctx context.Context, max int64) (*Slots, error) {
	s := a.slots(max)
	if err := s.sem.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	return s, nil
}

// Release gives back a slot taken with TakeSlot or WaitSlot.
func (s *Slots) Release() { s.sem.Release(1) }
