package lifecycle

import "time"

// Store is what the Manager needs from its persistence: sandbox records
// with compare-and-set transitions, the append-only event log and the
// webhook outbox, committed together. The Badger store (package store)
// implements it. Implementations wrap ErrNotFound, ErrExists and
// ErrConflict (a transition from a state it does not allow) as those
// sentinels, and ErrStoreUnavailable when they cannot write.
type Store interface {
	// Get returns the record of id.
	Get(id string) (Record, error)
	// List returns the records keep accepts (all when keep is nil).
	List(keep func(*Record) bool) ([]Record, error)
	// Page returns, in id order, up to limit records with ids above after
	// ("" : from the first) that keep accepts (all when nil).
	Page(after string, limit int, keep func(*Record) bool) ([]Record, error)
	// Create stores a new record and its first event.
	Create(r Record, reason string) (Record, Event, error)
	// Transition moves id to state to if its state is one of from, after
	// mutate, writing the record and the event in one transaction.
	Transition(id string, from []State, to State, reason string, mutate func(*Record) error) (Record, Event, error)
	// Update changes a record without an event.
	Update(id string, mutate func(*Record) error) (Record, error)
	// UpdateMany changes the records of ids in one batch (missing ids are
	// skipped).
	UpdateMany(ids []string, mutate func(*Record)) error
	// Delete removes a record, appending an event of eventType; an
	// EventPurged also forgets the volume's owner.
	Delete(id, eventType, reason string) (Event, error)
	// AppendEvent appends an event not tied to a transition.
	AppendEvent(ev Event) (Event, error)
	// VolumeOwner returns whose sandbox id's workspace volume is, as
	// recorded when a record made it (ErrNotFound: nothing recorded);
	// SetVolumeOwner records it.
	VolumeOwner(id string) (VolumeOwner, error)
	SetVolumeOwner(id string, o VolumeOwner) error
	// PurgeVolume forgets whose sandbox ev.SandboxID's volume was and
	// appends ev (an EventPurged of a sandbox without a record), carrying
	// the owner's incarnation and labels, in one transaction.
	PurgeVolume(ev Event) (Event, error)
	// History returns the events of a sandbox, oldest first.
	History(sandbox string) ([]Event, error)
	// LastEventID is the id of the newest event (0: none).
	LastEventID() (uint64, error)
	// EventsAfter returns up to limit events with ids above after.
	EventsAfter(after uint64, limit int) ([]Event, error)
	// PruneEvents removes events older than before and reports how many.
	PruneEvents(before time.Time) (int, error)
	// OutboxPending and OutboxAck serve webhook delivery.
	OutboxPending(target string, limit int) ([]Event, error)
	OutboxAck(target string, id uint64) error
	// Check reports whether the store takes writes.
	Check() error
	// OnCommit sets the function called with every committed event, in id
	// order, under the store's write lock.
	OnCommit(fn func(Event))
	// SetOutboxTargets sets the function naming the webhook targets each
	// new event is queued for.
	SetOutboxTargets(fn func(Event) []string)
}
