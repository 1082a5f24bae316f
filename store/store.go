package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"

	"github.com/sandwake/sandwake/lifecycle"
)

// DefaultMinFreeBytes covers what Badger may still write through its
// mapped files: two memtable logs and two value-log files (see Open).
const DefaultMinFreeBytes = 64 << 20

// SchemaVersion is the layout version written to every store. Opening a store
// written by a newer sandwake fails instead of misreading it.
const SchemaVersion = 1

// Errors of the store itself. Errors about records wrap lifecycle's
// sentinels (lifecycle.ErrNotFound, lifecycle.ErrExists,
// lifecycle.ErrConflict, lifecycle.ErrStoreUnavailable): the Manager tells
// them apart without knowing which Store it has. All are wrapped with
// context; test with errors.Is.
var (
	// ErrInstanceMismatch: the configured instance name is not the store's.
	ErrInstanceMismatch = errors.New("instance mismatch")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store closed")
)

// StateError reports a transition refused because the record's current state
// is not one it may leave from. It matches lifecycle.ErrConflict with
// errors.Is.
type StateError struct {
	ID      string
	Current lifecycle.State
	To      lifecycle.State
	Allowed []lifecycle.State
}

func (e *StateError) Error() string {
	return fmt.Sprintf("sandbox %s is %s: cannot go to %s (allowed from %v)", e.ID, e.Current, e.To, e.Allowed)
}

// Is makes errors.Is(err, lifecycle.ErrConflict) true.
func (e *StateError) Is(target error) bool { return target == lifecycle.ErrConflict }

// Options configure Open.
type Options struct {
	// Dir is the directory holding the database. Created (0700) when missing.
	// Ignored with InMemory.
	Dir string
	// InMemory keeps everything in memory; for unit tests.
	InMemory bool
	// Now is the clock used for event timestamps. Default: time.Now.
	Now func() time.Time
	// Logger receives Badger's own log lines. Default: discarded.
	Logger badger.Logger
	// MinFreeBytes is the free space the store's file system must keep:
	// below it, writes fail with an error wrapping syscall.ENOSPC instead
	// of letting Badger write into its memory-mapped files, which on a full
	// file system kills the process (SIGBUS). 0 means DefaultMinFreeBytes;
	// negative turns the check off. Ignored in memory unless FreeBytes
	// is set.
	MinFreeBytes int64
	// FreeBytes reports the free space of the store's file system for the
	// MinFreeBytes check. Default: statfs of Dir.
	FreeBytes func() (int64, error)
	// OutboxTargets, when set, names the webhook targets an event must be
	// delivered to; one outbox entry per target is written in the same
	// transaction as the event. SetOutboxTargets changes it later.
	OutboxTargets func(lifecycle.Event) []string
}

// Store is an open sandwake database. All methods are safe for concurrent use.
type Store struct {
	db   *badger.DB
	now  func() time.Time
	opts Options

	// mu serialises every write that appends to the event log, so that event
	// ids are committed in the order they are allocated: a reader resuming
	// after id N can never miss an id below N committed later.
	mu      sync.Mutex
	nextSeq uint64
	closed  bool
	// onCommit is called with each committed event, in id order, while the
	// write lock is still held (see OnCommit).
	onCommit atomic.Pointer[func(lifecycle.Event)]
	// outboxTargets names the webhook targets of an event (see Options).
	outboxTargets atomic.Pointer[func(lifecycle.Event) []string]
	// unwritable is why the last write failed for want of a writable file
	// system; nil once a write succeeds (see Check).
	unwritable atomic.Pointer[UnwritableError]

	// fresh: the store had no schema when opened (a new store).
	fresh bool

	gcStop chan struct{}
	gcDone chan struct{}
}

// Fresh reports whether the store was new when opened: it held nothing, not
// even a schema. A gateway whose store is fresh while the engine holds
// containers of its instance has lost its store (see lifecycle's orphans).
func (s *Store) Fresh() bool { return s.fresh }

// Key layout. Event ids are fixed-width big-endian so keys sort by id.
var (
	keySchema     = []byte("meta/schema")
	prefixRecord  = []byte("sb/")
	prefixEvent   = []byte("ev/")
	prefixHistory = []byte("eh/") // eh/<sandbox>\x00<seq>: index of a sandbox's events
	prefixOutbox  = []byte("ob/") // ob/<target>\x00<seq>: pending webhook delivery
	prefixOwner   = []byte("vo/") // vo/<sandbox>: whose its workspace volume is (lifecycle.VolumeOwner)
)

// Open opens (creating when needed) the store described by opts.
func Open(opts Options) (*Store, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MinFreeBytes == 0 {
		opts.MinFreeBytes = DefaultMinFreeBytes
	}
	bopts := badger.DefaultOptions(opts.Dir).
		// Durable before reported: every commit is fsynced.
		WithSyncWrites(true).
		WithNumVersionsToKeep(1).
		// An embedded footprint: sandwake's data is small (a few KiB a
		// sandbox), so Badger's server-sized defaults (64 MiB memtables,
		// 256 MiB block cache) would dominate the gateway's memory.
		WithMemTableSize(8 << 20).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(4).
		WithBaseTableSize(2 << 20).
		WithBlockCacheSize(8 << 20).
		WithIndexCacheSize(4 << 20).
		WithValueLogFileSize(16 << 20).
		WithValueThreshold(1 << 10).
		WithNumCompactors(2).
		WithLogger(opts.Logger)
	if opts.Logger == nil {
		bopts = bopts.WithLogger(nil)
	}
	if opts.InMemory {
		bopts = bopts.WithDir("").WithValueDir("").WithInMemory(true)
	} else {
		if opts.Dir == "" {
			return nil, errors.New("opening store: no directory given")
		}
		if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("opening store: creating %s: %w", opts.Dir, err)
		}
		if err := checkPrivate(opts.Dir); err != nil {
			return nil, fmt.Errorf("opening store: %w", err)
		}
	}
	if !opts.InMemory {
		if err := checkIntact(opts.Dir); err != nil {
			return nil, fmt.Errorf("opening store in %s: %w", opts.Dir, err)
		}
	}
	db, err := badger.Open(bopts)
	if err == nil && !opts.InMemory {
		// Badger made its lock and memtable files 0666 less the umask:
		// private like the rest (the directory already keeps others out).
		if err = tightenFiles(opts.Dir, nil); err != nil {
			db.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("opening store in %s: %w", opts.Dir, err)
	}
	s := &Store{db: db, now: opts.Now, opts: opts}
	if opts.OutboxTargets != nil {
		s.SetOutboxTargets(opts.OutboxTargets)
	}
	if err := s.init(); err != nil {
		db.Close()
		return nil, err
	}
	if !opts.InMemory {
		if s.fresh && fileExists(filepath.Join(opts.Dir, markerFile)) {
			db.Close()
			return nil, fmt.Errorf("opening store in %s: %w: the directory held a sandwake store but its database is empty (value log or tables lost); restore it from a backup or move it away to start with an empty store", opts.Dir, ErrDamaged)
		}
		if err := writeMarker(opts.Dir); err != nil {
			db.Close()
			return nil, err
		}
	}
	if !opts.InMemory {
		s.gcStop = make(chan struct{})
		s.gcDone = make(chan struct{})
		go s.gcLoop(5 * time.Minute)
	}
	return s, nil
}

// init checks or writes the schema version and finds the next event id.
func (s *Store) init() error {
	err := s.db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(keySchema)
		if errors.Is(err, badger.ErrKeyNotFound) {
			s.fresh = true
			return txn.Set(keySchema, []byte(strconv.Itoa(SchemaVersion)))
		}
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(string(v))
		if err != nil {
			return fmt.Errorf("schema version %q is not a number", v)
		}
		if n > SchemaVersion {
			return fmt.Errorf("store has schema version %d, this sandwake understands up to %d: upgrade sandwake", n, SchemaVersion)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	last, err := s.LastEventID()
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	s.nextSeq = last + 1
	return nil
}

// gcLoop reclaims value-log space on a timer, as Badger requires of its users.
func (s *Store) gcLoop(every time.Duration) {
	defer close(s.gcDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.gcStop:
			return
		case <-t.C:
			for s.db.RunValueLogGC(0.5) == nil {
			}
		}
	}
}

// Close flushes and closes the database. Later calls return nil.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	if s.gcStop != nil {
		close(s.gcStop)
		<-s.gcDone
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("closing store: %w", err)
	}
	return nil
}

// OnCommit sets the function called with every event once it is committed,
// in event-id order. It runs under the store's write lock, so it must not block
// or call back into the store; it is how the event bus publishes transitions
// in exactly the order of the log.
func (s *Store) OnCommit(fn func(lifecycle.Event)) { s.onCommit.Store(&fn) }

// Secret returns the secret stored under name, creating it with gen on first
// use (in one transaction, so concurrent callers agree).
func (s *Store) Secret(name string, gen func() ([]byte, error)) ([]byte, error) {
	key := []byte("meta/secret/" + name)
	var out []byte
	err := s.db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if err == nil {
			out, err = item.ValueCopy(nil)
			return err
		}
		if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		if out, err = gen(); err != nil {
			return err
		}
		return txn.Set(key, out)
	})
	if err != nil {
		return nil, fmt.Errorf("reading secret %s: %w", name, err)
	}
	return out, nil
}

// Instance returns the name of the gateway instance this store belongs to.
// On first use it keeps configured, or gen() when configured is empty; later
// a configured name that differs from the kept one is refused: the
// containers of this store carry the kept name, and renaming would orphan
// them.
func (s *Store) Instance(configured string, gen func() string) (string, error) {
	key := []byte("meta/instance")
	var out string
	err := s.db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if err == nil {
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			out = string(v)
			if configured != "" && configured != out {
				return fmt.Errorf("%w: the store belongs to instance %q but the configuration says instance %q (its sandboxes are labelled %q; set instance %s or use another storage directory)",
					ErrInstanceMismatch, out, configured, out, out)
			}
			return nil
		}
		if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		out = configured
		if out == "" {
			out = gen()
		}
		return txn.Set(key, []byte(out))
	})
	if err != nil {
		return "", fmt.Errorf("reading instance name: %w", err)
	}
	return out, nil
}

// SetOutboxTargets sets the function that names the webhook targets each new
// event is queued for (nil: none). Like OnCommit it runs under the write lock.
func (s *Store) SetOutboxTargets(fn func(lifecycle.Event) []string) {
	if fn == nil {
		s.outboxTargets.Store(nil)
		return
	}
	s.outboxTargets.Store(&fn)
}

// Dir is the directory the store lives in ("" in memory).
func (s *Store) Dir() string { return s.opts.Dir }

func recordKey(id string) []byte { return append(append([]byte{}, prefixRecord...), id...) }

func seqBytes(seq uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return b[:]
}

func eventKey(seq uint64) []byte { return append(append([]byte{}, prefixEvent...), seqBytes(seq)...) }

func historyKey(sandbox string, seq uint64) []byte {
	k := append(append([]byte{}, prefixHistory...), sandbox...)
	k = append(k, 0)
	return append(k, seqBytes(seq)...)
}

func outboxPrefix(target string) []byte {
	k := append(append([]byte{}, prefixOutbox...), target...)
	return append(k, 0)
}

func outboxKey(target string, seq uint64) []byte {
	return append(outboxPrefix(target), seqBytes(seq)...)
}

func decodeRecord(item *badger.Item) (lifecycle.Record, error) {
	var r lifecycle.Record
	err := item.Value(func(v []byte) error { return json.Unmarshal(v, &r) })
	if err != nil {
		return lifecycle.Record{}, fmt.Errorf("decoding record %s: %w", bytes.TrimPrefix(item.Key(), prefixRecord), err)
	}
	return r, nil
}

func getRecord(txn *badger.Txn, id string) (lifecycle.Record, error) {
	item, err := txn.Get(recordKey(id))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return lifecycle.Record{}, fmt.Errorf("sandbox %s: %w", id, lifecycle.ErrNotFound)
	}
	if err != nil {
		return lifecycle.Record{}, fmt.Errorf("reading sandbox %s: %w", id, err)
	}
	return decodeRecord(item)
}

// Get returns the record with the given id, or an error matching ErrNotFound.
func (s *Store) Get(id string) (lifecycle.Record, error) {
	var r lifecycle.Record
	err := s.db.View(func(txn *badger.Txn) error {
		var err error
		r, err = getRecord(txn, id)
		return err
	})
	return r, err
}

// List returns every record for which keep returns true (all when keep is
// nil), ordered by id.
func (s *Store) List(keep func(*lifecycle.Record) bool) ([]lifecycle.Record, error) {
	var out []lifecycle.Record
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixRecord, PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			r, err := decodeRecord(it.Item())
			if err != nil {
				return err
			}
			if keep == nil || keep(&r) {
				out = append(out, r)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	return out, nil
}

// Page implements lifecycle.Store: a seek to the first record after
// after, then a walk in key (id) order until limit records are kept. Its
// cost is the records read, not the store's size.
func (s *Store) Page(after string, limit int, keep func(*lifecycle.Record) bool) ([]lifecycle.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	out := make([]lifecycle.Record, 0, min(limit, 1024))
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixRecord, PrefetchValues: true, PrefetchSize: min(limit, 100)})
		defer it.Close()
		start := prefixRecord
		if after != "" {
			start = append(recordKey(after), 0) // the first key past after
		}
		for it.Seek(start); it.Valid() && len(out) < limit; it.Next() {
			r, err := decodeRecord(it.Item())
			if err != nil {
				return err
			}
			if keep == nil || keep(&r) {
				out = append(out, r)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing a page of sandboxes: %w", err)
	}
	return out, nil
}

// Interface guard: the Badger store is a lifecycle.Store.
var _ lifecycle.Store = (*Store)(nil)
