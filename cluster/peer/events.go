package peer

import (
	"sync"
	"time"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/lifecycle"
)

// remoteEventBuffer is how many events of other nodes a stream may fall
// behind before it loses its subscription (and subscribes again).
const remoteEventBuffer = 256

// Event is a transition of another node's sandbox as the catalog shows
// it. It carries no id: event ids are per node (each node's own log), so
// resuming with Last-Event-ID covers this node's events only.
type Event struct {
	Type      string          `json:"type"`
	SandboxID string          `json:"sandbox_id"`
	Node      string          `json:"node"`
	From      lifecycle.State `json:"from,omitempty"`
	To        lifecycle.State `json:"to,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	At        time.Time       `json:"at"`
	// Incarnation and Labels are the sandbox's, from its owner's signed
	// catalog entry: streams show a token the events it sees (as for
	// this node's own events).
	Incarnation string            `json:"incarnation,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
}

// RemoteEvents turns the catalog watch into events for the API's streams:
// one "sandbox.<state>" per state change of another node's sandbox, and
// "sandbox.destroyed" when its entry goes. Observe runs on the cluster's
// watch goroutine and never blocks: a subscriber that is full loses its
// subscription.
type RemoteEvents struct {
	self string

	mu     sync.Mutex
	last   map[string]lifecycle.State
	subs   map[*Subscription]struct{}
	closed bool
}

// Subscription is one stream's subscription; C is closed when the stream fell
// behind or the engine closes.
type Subscription struct {
	C      chan Event
	r      *RemoteEvents
	Lagged bool
}

func newRemoteEvents(self string) *RemoteEvents {
	return &RemoteEvents{self: self, last: map[string]lifecycle.State{}, subs: map[*Subscription]struct{}{}}
}

// observe is the cluster's watch callback.
func (r *RemoteEvents) observe(ch cluster.Change) {
	en := ch.Entry
	r.mu.Lock()
	defer r.mu.Unlock()
	prev, seen := r.last[en.ID]
	if ch.Deleted {
		delete(r.last, en.ID)
	} else {
		r.last[en.ID] = en.State
	}
	if en.Node == r.self || r.closed {
		return
	}
	ev := Event{SandboxID: en.ID, Node: en.Node, Reason: en.Reason, At: en.UpdatedAt, Incarnation: en.Incarnation, Labels: en.Labels}
	switch {
	case ch.Deleted:
		ev.Type, ev.From = "sandbox.destroyed", prev
	case seen && prev == en.State:
		return // a change of something else (ports, tokens): no transition
	default:
		ev.Type, ev.To = "sandbox."+string(en.State), en.State
		if seen {
			ev.From = prev
		}
	}
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	for s := range r.subs {
		select {
		case s.C <- ev:
		default:
			s.Lagged = true
			delete(r.subs, s)
			close(s.C)
		}
	}
}

// Subscribe opens a subscription; the caller cancels it.
func (r *RemoteEvents) Subscribe() *Subscription {
	s := &Subscription{C: make(chan Event, remoteEventBuffer), r: r}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		close(s.C)
		return s
	}
	r.subs[s] = struct{}{}
	return s
}

// Cancel ends the subscription.
func (s *Subscription) Cancel() {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if _, ok := s.r.subs[s]; ok {
		delete(s.r.subs, s)
		close(s.C)
	}
}

// close ends every subscription (the engine is closing).
func (r *RemoteEvents) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for s := range r.subs {
		delete(r.subs, s)
		close(s.C)
	}
}
