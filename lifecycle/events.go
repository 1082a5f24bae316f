package lifecycle

import "sync"

// subscriberBuffer bounds how far a subscriber may fall behind before it is
// dropped; a dropped subscriber resumes from the event log by id.
const subscriberBuffer = 256

// Subscription receives the events published after it was made.
type Subscription struct {
	// C delivers events in id order. It is closed when the subscription is
	// cancelled or when the subscriber fell behind (Lagged then reports true).
	C      <-chan Event
	c      chan Event
	bus    *bus
	lagged bool
}

// Lagged reports whether C was closed because the subscriber did not keep up.
// Read it after C is closed.
func (s *Subscription) Lagged() bool {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	return s.lagged
}

// Cancel ends the subscription and closes C. Safe to call more than once.
func (s *Subscription) Cancel() { s.bus.remove(s, false) }

// bus fans events out to subscribers without ever blocking the publisher: a
// transition never waits for a slow consumer.
type bus struct {
	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	closed bool
}

func (b *bus) subscribe() *Subscription {
	c := make(chan Event, subscriberBuffer)
	s := &Subscription{C: c, c: c, bus: b}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(c)
		return s
	}
	if b.subs == nil {
		b.subs = make(map[*Subscription]struct{})
	}
	b.subs[s] = struct{}{}
	return s
}

func (b *bus) remove(s *Subscription, lagged bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[s]; !ok {
		return
	}
	delete(b.subs, s)
	s.lagged = lagged
	close(s.c)
}

func (b *bus) publish(ev Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		select {
		case s.c <- ev:
		default:
			delete(b.subs, s)
			s.lagged = true
			close(s.c)
		}
	}
}

func (b *bus) closeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for s := range b.subs {
		delete(b.subs, s)
		close(s.c)
	}
}
