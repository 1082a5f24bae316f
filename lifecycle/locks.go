package lifecycle

import "sync"

// idLocks serialises operations per sandbox id: a wake, a pause by the reaper
// and an API stop of the same sandbox never interleave, while different
// sandboxes proceed in parallel. Entries are dropped when unused.
type idLocks struct {
	mu    sync.Mutex
	locks map[string]*idLock
}

type idLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks id and returns the function that unlocks it.
func (l *idLocks) lock(id string) (unlock func()) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = make(map[string]*idLock)
	}
	e := l.locks[id]
	if e == nil {
		e = &idLock{}
		l.locks[id] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() { l.release(id, e) }
}

// release unlocks e and forgets it when nobody else waits for it.
func (l *idLocks) release(id string, e *idLock) {
	e.mu.Unlock()
	l.mu.Lock()
	e.refs--
	if e.refs == 0 {
		delete(l.locks, id)
	}
	l.mu.Unlock()
}

// tryLock locks id if nobody holds it, for work that should rather skip a
// sandbox in use than wait (reaper, eviction).
func (l *idLocks) tryLock(id string) (unlock func(), ok bool) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = make(map[string]*idLock)
	}
	e := l.locks[id]
	if e == nil {
		e = &idLock{}
		l.locks[id] = e
	}
	if !e.mu.TryLock() {
		if e.refs == 0 {
			delete(l.locks, id)
		}
		l.mu.Unlock()
		return nil, false
	}
	e.refs++
	l.mu.Unlock()
	return func() { l.release(id, e) }, true
}
