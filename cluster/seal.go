package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// This file signs catalog entries. Lists, pages and event streams of other
// nodes' sandboxes are built from the catalog, and routing follows it, so
// an entry must be trustworthy without asking its owner: the node that
// writes one signs every field of it (with a key derived from the cluster
// secret, which an etcd writer does not have), and every reader checks the
// signature before using it. An entry that fails is ignored: not listed,
// not routed, its events not shown, counted (Stats.RejectedEntries); its
// owner writes it back (see the publisher's repair).
//
// A signature proves a node wrote the entry, not when: an etcd writer can
// put back an older entry of the same id that a node signed. Such a replay
// shows what the catalog once said of that id until the owner repairs it,
// and grants nothing: calls are decided by the owner against its record.

// ErrForged: a catalog entry without a valid signature of a cluster node.
var ErrForged = errors.New("catalog entry not signed by a node of the cluster")

// entryKeyLabel derives the entries' key from the cluster secret, apart
// from the key of forwarded requests.
const entryKeyLabel = "sandwake catalog entry v1"

func (c *Cluster) entryKey() []byte {
	m := hmac.New(sha256.New, c.cfg.Secret)
	m.Write([]byte(entryKeyLabel))
	return m.Sum(nil)
}

// entrySig is the signature of e (its Sig and Revision ignored) as the
// entry of id.
func (c *Cluster) entrySig(id string, e Entry) (string, error) {
	e.ID, e.Sig, e.Revision = id, "", 0
	b, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, c.ekey)
	m.Write(b)
	return hex.EncodeToString(m.Sum(nil)), nil
}

// sealEntry signs e and returns what is written to etcd.
func (c *Cluster) sealEntry(e Entry) ([]byte, error) {
	sig, err := c.entrySig(e.ID, e)
	if err != nil {
		return nil, fmt.Errorf("signing entry %s: %w", e.ID, err)
	}
	e.Sig = sig
	return json.Marshal(e)
}

// decodeEntry reads a catalog value and checks its signature. A value that
// is not an entry, or not signed by a node, yields an entry owned by
// nobody (so that its owner overwrites it) and an error (ErrForged for a
// bad signature).
func (c *Cluster) decodeEntry(id string, kv kv) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(kv.Value, &e); err != nil {
		return Entry{ID: id, Revision: kv.Rev}, fmt.Errorf("catalog entry %s: %w", id, err)
	}
	want, err := c.entrySig(id, e)
	if err != nil || !hmac.Equal([]byte(want), []byte(e.Sig)) {
		c.rejected.Add(1)
		return Entry{ID: id, Revision: kv.Rev}, fmt.Errorf("catalog entry %s (claiming node %q): %w", id, e.Node, ErrForged)
	}
	e.ID = id
	e.Revision = kv.Rev
	return e, nil
}
