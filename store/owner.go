package store

import (
	"encoding/json"
	"errors"
	"fmt"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/sandwake/sandwake/lifecycle"
)

func ownerKey(id string) []byte { return append(append([]byte{}, prefixOwner...), id...) }

// VolumeOwner returns whose sandbox id's workspace volume is, as recorded
// when a record made it; lifecycle.ErrNotFound when nothing is recorded.
func (s *Store) VolumeOwner(id string) (lifecycle.VolumeOwner, error) {
	var o lifecycle.VolumeOwner
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(ownerKey(id))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return fmt.Errorf("volume owner of sandbox %s: %w", id, lifecycle.ErrNotFound)
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error { return json.Unmarshal(v, &o) })
	})
	return o, err
}

// SetVolumeOwner records whose sandbox id's workspace volume is.
func (s *Store) SetVolumeOwner(id string, o lifecycle.VolumeOwner) error {
	b, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("encoding the volume owner of sandbox %s: %w", id, err)
	}
	err = s.write(func(txn *badger.Txn, _ func(lifecycle.Event) (lifecycle.Event, error)) error {
		return txn.Set(ownerKey(id), b)
	})
	if err != nil {
		return fmt.Errorf("recording the volume owner of sandbox %s: %w", id, err)
	}
	return nil
}

// PurgeVolume forgets whose sandbox id's volume was (the volume is gone)
// and appends ev, in one transaction; ev carries the owner's incarnation
// and labels when ev has none of its own.
func (s *Store) PurgeVolume(ev lifecycle.Event) (lifecycle.Event, error) {
	err := s.write(func(txn *badger.Txn, appendEvent func(lifecycle.Event) (lifecycle.Event, error)) error {
		key := ownerKey(ev.SandboxID)
		if item, err := txn.Get(key); err == nil {
			var o lifecycle.VolumeOwner
			if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &o) }); err == nil && ev.Incarnation == "" {
				ev.Incarnation, ev.Labels = o.Incarnation, o.Labels
			}
			if err := txn.Delete(key); err != nil {
				return err
			}
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		var err error
		ev, err = appendEvent(ev)
		return err
	})
	if err != nil {
		return lifecycle.Event{}, fmt.Errorf("purging the volume of sandbox %s: %w", ev.SandboxID, err)
	}
	return ev, nil
}
