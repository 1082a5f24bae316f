package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/sandwake/sandwake/lifecycle"
)

func decodeEvent(v []byte) (lifecycle.Event, error) {
	var ev lifecycle.Event
	if err := json.Unmarshal(v, &ev); err != nil {
		return lifecycle.Event{}, fmt.Errorf("decoding event: %w", err)
	}
	return ev, nil
}

// LastEventID is the id of the newest event, 0 when the log is empty.
func (s *Store) LastEventID() (uint64, error) {
	var last uint64
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixEvent, Reverse: true})
		defer it.Close()
		// A reverse iterator must seek past the last possible key of the prefix.
		it.Seek(append(append([]byte{}, prefixEvent...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
		if it.Valid() {
			last = binary.BigEndian.Uint64(it.Item().Key()[len(prefixEvent):])
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("reading last event id: %w", err)
	}
	return last, nil
}

// EventsAfter returns up to limit events with ids greater than after, oldest
// first (limit <= 0: all).
func (s *Store) EventsAfter(after uint64, limit int) ([]lifecycle.Event, error) {
	var out []lifecycle.Event
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixEvent, PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Seek(eventKey(after + 1)); it.Valid(); it.Next() {
			var ev lifecycle.Event
			err := it.Item().Value(func(v []byte) error {
				var err error
				ev, err = decodeEvent(v)
				return err
			})
			if err != nil {
				return err
			}
			out = append(out, ev)
			if limit > 0 && len(out) == limit {
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading events after %d: %w", after, err)
	}
	return out, nil
}

// History returns every event of one sandbox, oldest first. It works after the
// sandbox's record is gone.
func (s *Store) History(sandbox string) ([]lifecycle.Event, error) {
	var out []lifecycle.Event
	err := s.db.View(func(txn *badger.Txn) error {
		prefix := historyKey(sandbox, 0)[:len(prefixHistory)+len(sandbox)+1]
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			seq := binary.BigEndian.Uint64(it.Item().Key()[len(prefix):])
			item, err := txn.Get(eventKey(seq))
			if err != nil {
				return fmt.Errorf("event %d: %w", seq, err)
			}
			err = item.Value(func(v []byte) error {
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
		return nil, fmt.Errorf("reading history of sandbox %s: %w", sandbox, err)
	}
	return out, nil
}

// PruneEvents deletes events older than before from the log and the
// per-sandbox history (outbox entries are removed by delivery). Ids are
// never reused. It returns how many events were removed.
func (s *Store) PruneEvents(before time.Time) (int, error) {
	removed := 0
	for {
		var keys [][]byte
		err := s.db.View(func(txn *badger.Txn) error {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixEvent, PrefetchValues: true, PrefetchSize: 100})
			defer it.Close()
			for it.Rewind(); it.Valid() && len(keys) < 2*pruneBatch; it.Next() {
				var ev lifecycle.Event
				err := it.Item().Value(func(v []byte) error {
					var err error
					ev, err = decodeEvent(v)
					return err
				})
				if err != nil {
					return err
				}
				if !ev.At.Before(before) {
					break
				}
				keys = append(keys, it.Item().KeyCopy(nil), historyKey(ev.SandboxID, ev.ID))
			}
			return nil
		})
		if err != nil {
			return removed, fmt.Errorf("pruning events: %w", err)
		}
		if len(keys) == 0 {
			return removed, nil
		}
		wb := s.db.NewWriteBatch()
		for _, k := range keys {
			if err := wb.Delete(k); err != nil {
				wb.Cancel()
				return removed, fmt.Errorf("pruning events: %w", err)
			}
		}
		if err := wb.Flush(); err != nil {
			return removed, fmt.Errorf("pruning events: %w", err)
		}
		removed += len(keys) / 2
	}
}

// pruneBatch is how many events one pruning transaction removes.
const pruneBatch = 1000
