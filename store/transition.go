package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/sandwake/sandwake/lifecycle"
)

// write runs fn in one read-write transaction under the event-log lock and
// commits it (synced). fn appends events through the returned appender so that
// their ids are allocated in commit order.
func (s *Store) write(fn func(txn *badger.Txn, appendEvent func(lifecycle.Event) (lifecycle.Event, error)) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.checkSpace(); err != nil {
		s.unwritable.Store(err)
		return err
	}
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	next := s.nextSeq
	var appended []lifecycle.Event
	appendEvent := func(ev lifecycle.Event) (lifecycle.Event, error) {
		ev.ID = next
		if ev.At.IsZero() {
			ev.At = s.now().UTC()
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return lifecycle.Event{}, err
		}
		if err := txn.Set(eventKey(ev.ID), b); err != nil {
			return lifecycle.Event{}, err
		}
		if err := txn.Set(historyKey(ev.SandboxID, ev.ID), nil); err != nil {
			return lifecycle.Event{}, err
		}
		if fn := s.outboxTargets.Load(); fn != nil {
			for _, target := range (*fn)(ev) {
				if err := txn.Set(outboxKey(target, ev.ID), b); err != nil {
					return lifecycle.Event{}, err
				}
			}
		}
		next++
		appended = append(appended, ev)
		return ev, nil
	}
	if err := fn(txn, appendEvent); err != nil {
		return err
	}
	if err := txn.Commit(); err != nil {
		if errors.Is(err, badger.ErrConflict) {
			return fmt.Errorf("committing: %w", err)
		}
		uerr := s.commitFailed(err)
		s.unwritable.Store(uerr)
		return fmt.Errorf("committing: %w", uerr)
	}
	if s.unwritable.Load() != nil {
		s.unwritable.Store(nil)
	}
	s.nextSeq = next
	if fn := s.onCommit.Load(); fn != nil {
		for _, ev := range appended {
			(*fn)(ev)
		}
	}
	return nil
}

func putRecord(txn *badger.Txn, r *lifecycle.Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding sandbox %s: %w", r.ID, err)
	}
	return txn.Set(recordKey(r.ID), b)
}

// Create stores a new record and its first event (from no state to r.State).
// It fails with ErrExists when the id is taken.
func (s *Store) Create(r lifecycle.Record, reason string) (lifecycle.Record, lifecycle.Event, error) {
	var ev lifecycle.Event
	err := s.write(func(txn *badger.Txn, appendEvent func(lifecycle.Event) (lifecycle.Event, error)) error {
		if _, err := txn.Get(recordKey(r.ID)); err == nil {
			return fmt.Errorf("sandbox %s: %w", r.ID, lifecycle.ErrExists)
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		if err := putRecord(txn, &r); err != nil {
			return err
		}
		var err error
		ev, err = appendEvent(lifecycle.Event{Type: lifecycle.EventType(r.State), SandboxID: r.ID, To: r.State, Reason: reason, At: r.StateSince,
			Incarnation: r.Incarnation, Labels: r.Spec.Labels})
		return err
	})
	if err != nil {
		return lifecycle.Record{}, lifecycle.Event{}, fmt.Errorf("creating sandbox %s: %w", r.ID, err)
	}
	return r, ev, nil
}

// Transition moves record id from one of the states in from to state to, in
// one transaction that compares the current state (compare-and-set), applies
// mutate (which may be nil) and appends the transition's event. The change is
// synced to disk before Transition returns. A record in a state not in from is
// left untouched and a *StateError is returned. If mutate returns an error,
// nothing is written.
func (s *Store) Transition(id string, from []lifecycle.State, to lifecycle.State, reason string, mutate func(*lifecycle.Record) error) (lifecycle.Record, lifecycle.Event, error) {
	var (
		rec lifecycle.Record
		ev  lifecycle.Event
	)
	err := s.write(func(txn *badger.Txn, appendEvent func(lifecycle.Event) (lifecycle.Event, error)) error {
		var err error
		rec, err = getRecord(txn, id)
		if err != nil {
			return err
		}
		if !slices.Contains(from, rec.State) {
			return &StateError{ID: id, Current: rec.State, To: to, Allowed: from}
		}
		prev := rec.State
		if mutate != nil {
			if err := mutate(&rec); err != nil {
				return err
			}
		}
		at := s.now().UTC()
		rec.State = to
		rec.Reason = reason
		if prev != to {
			rec.StateSince = at
		}
		if err := putRecord(txn, &rec); err != nil {
			return err
		}
		ev, err = appendEvent(lifecycle.Event{Type: lifecycle.EventType(to), SandboxID: id, From: prev, To: to, Reason: reason, At: at,
			Incarnation: rec.Incarnation, Labels: rec.Spec.Labels})
		return err
	})
	if err != nil {
		return lifecycle.Record{}, lifecycle.Event{}, fmt.Errorf("sandbox %s to %s: %w", id, to, err)
	}
	return rec, ev, nil
}

// Update applies mutate to record id without a state change and without an
// event (settings, keepalive, activity). mutate must not change State.
func (s *Store) Update(id string, mutate func(*lifecycle.Record) error) (lifecycle.Record, error) {
	var rec lifecycle.Record
	err := s.write(func(txn *badger.Txn, _ func(lifecycle.Event) (lifecycle.Event, error)) error {
		var err error
		rec, err = getRecord(txn, id)
		if err != nil {
			return err
		}
		state := rec.State
		if err := mutate(&rec); err != nil {
			return err
		}
		if rec.State != state {
			return fmt.Errorf("update may not change state (%s to %s): use Transition", state, rec.State)
		}
		return putRecord(txn, &rec)
	})
	if err != nil {
		return lifecycle.Record{}, fmt.Errorf("updating sandbox %s: %w", id, err)
	}
	return rec, nil
}

// UpdateMany applies mutate to each existing record in ids in one transaction;
// ids without a record are skipped. It is the activity flush: one batch, one
// sync, however many sandboxes were active.
func (s *Store) UpdateMany(ids []string, mutate func(*lifecycle.Record)) error {
	err := s.write(func(txn *badger.Txn, _ func(lifecycle.Event) (lifecycle.Event, error)) error {
		for _, id := range ids {
			rec, err := getRecord(txn, id)
			if errors.Is(err, lifecycle.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			mutate(&rec)
			if err := putRecord(txn, &rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("updating %d sandboxes: %w", len(ids), err)
	}
	return nil
}

// Delete removes record id and appends an event of type eventType (EventDestroyed
// or EventPurged) from its last state. A purge also forgets whose the
// sandbox's volume was.
func (s *Store) Delete(id, eventType, reason string) (lifecycle.Event, error) {
	var ev lifecycle.Event
	err := s.write(func(txn *badger.Txn, appendEvent func(lifecycle.Event) (lifecycle.Event, error)) error {
		rec, err := getRecord(txn, id)
		if err != nil {
			return err
		}
		if err := txn.Delete(recordKey(id)); err != nil {
			return err
		}
		if eventType == lifecycle.EventPurged {
			// The volume went with the record: nobody owns it now.
			if err := txn.Delete(ownerKey(id)); err != nil {
				return err
			}
		}
		ev, err = appendEvent(lifecycle.Event{Type: eventType, SandboxID: id, From: rec.State, Reason: reason,
			Incarnation: rec.Incarnation, Labels: rec.Spec.Labels})
		return err
	})
	if err != nil {
		return lifecycle.Event{}, fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return ev, nil
}

// AppendEvent appends an event that belongs to no record change (for example
// the purge of a sandbox whose record was destroyed earlier).
func (s *Store) AppendEvent(ev lifecycle.Event) (lifecycle.Event, error) {
	err := s.write(func(_ *badger.Txn, appendEvent func(lifecycle.Event) (lifecycle.Event, error)) error {
		var err error
		ev, err = appendEvent(ev)
		return err
	})
	if err != nil {
		return lifecycle.Event{}, fmt.Errorf("appending event for sandbox %s: %w", ev.SandboxID, err)
	}
	return ev, nil
}
