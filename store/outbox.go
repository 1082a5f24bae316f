package store

import (
	"fmt"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/sandwake/sandwake/lifecycle"
)

// OutboxPending returns up to limit events still to be delivered to target,
// oldest first. Entries are written with their event (see
// Options.OutboxTargets), so a delivery survives restarts until acknowledged.
func (s *Store) OutboxPending(target string, limit int) ([]lifecycle.Event, error) {
	var out []lifecycle.Event
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: outboxPrefix(target), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid() && (limit <= 0 || len(out) < limit); it.Next() {
			err := it.Item().Value(func(v []byte) error {
				ev, err := decodeEvent(v)
				out = append(out, ev)
				return err
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading outbox of %s: %w", target, err)
	}
	return out, nil
}

// OutboxAck removes the delivered event id from target's outbox.
func (s *Store) OutboxAck(target string, id uint64) error {
	err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(outboxKey(target, id)) })
	if err != nil {
		return fmt.Errorf("acknowledging event %d for %s: %w", id, target, err)
	}
	return nil
}
