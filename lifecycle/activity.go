package lifecycle

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Activity is a sandbox's in-memory activity: when it last served a request
// and how many proxied exchanges (websockets and SSE included) are open. The
// request path only does atomic operations on it; the store learns of it in
// one batch every activity_flush.
//
// It is also the hand-off between the request path and everything that
// pauses or stops the sandbox: a request registers with Enter, a pause or
// stop marks the sandbox as going down (beginDown) on the same atomic word,
// so exactly one of them goes first. Either the request is registered and an
// idle pause or eviction backs off, or the sandbox is going down and the
// request is not sent to it (the gate holds it through the next wake).
type Activity struct {
	last atomic.Int64 // unix nanoseconds of the last request
	// open counts open exchanges in its low bits; goingDown (added once
	// per pause or stop in progress) marks the sandbox as going down.
	open atomic.Int64
	// downs counts the pauses and stops begun: a route read before one of
	// them is stale even if the sandbox is up again.
	downs atomic.Uint64
	clock func() time.Time
	// lim bounds the exchanges open at once (see Slots); nil until the
	// first bounded request.
	lim atomic.Pointer[Slots]
	// flushed is the last value written to the store, guarded by the
	// manager's flushMu.
	flushed int64
}

// Touch records a request now (by the manager's clock).
func (a *Activity) Touch() {
	n := a.clock().UnixNano()
	// Concurrent touches may race; keeping the larger one is enough.
	if n > a.last.Load() {
		a.last.Store(n)
	}
}

// goingDown is the unit of Activity.open that marks a pause or stop in
// progress; the open count stays far below it.
const goingDown = int64(1) << 40

// Enter registers one more open exchange (and touches) unless the sandbox is
// going down or has gone down since the caller read downs (see Downs): then
// it registers nothing and reports false, and the request must not be sent
// to the container. Lock-free and allocation-free: it is on the hot path.
func (a *Activity) Enter(downs uint64) bool {
	a.Touch()
	if a.open.Add(1) >= goingDown || a.downs.Load() != downs {
		a.open.Add(-1)
		return false
	}
	return true
}

// Downs is the number of pauses and stops begun so far; a caller reads it
// before reading the record it will route by, and passes it to Enter.
func (a *Activity) Downs() uint64 { return a.downs.Load() }

// GoingDown reports whether a pause or stop of the sandbox is in progress.
func (a *Activity) GoingDown() bool { return a.open.Load() >= goingDown }

// beginDown marks the sandbox as going down. Unless force, it does so only
// when no exchange is open, and reports whether it did; a forced one (the
// API, expiry) always does, and the open exchanges are cut by the stop. The
// caller holds the sandbox's lock and calls endDown once the new state is
// recorded (or the operation failed).
func (a *Activity) beginDown(force bool) bool {
	if force {
		a.open.Add(goingDown)
	} else if !a.open.CompareAndSwap(0, goingDown) {
		return false
	}
	a.downs.Add(1)
	return true
}

// endDown ends what beginDown began.
func (a *Activity) endDown() { a.open.Add(-goingDown) }

// Open counts one more open exchange and touches.
func (a *Activity) Open() {
	a.Touch()
	a.open.Add(1)
}

// Close counts one exchange done.
func (a *Activity) Close() { a.open.Add(-1) }

// Finish ends an exchange: it counts as activity at its end (a websocket open
// for an hour was active all along) and is no longer open. A method, so that
// `defer a.Finish()` allocates nothing.
func (a *Activity) Finish() {
	a.Touch()
	a.open.Add(-1)
}

// OpenConnections is the number of exchanges open now.
func (a *Activity) OpenConnections() int64 { return a.open.Load() % goingDown }

// LastActive is the time of the last request seen since the process started
// (zero if none).
func (a *Activity) LastActive() time.Time {
	n := a.last.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// activities maps sandbox ids to their Activity.
type activities struct {
	m     sync.Map // id → *Activity
	clock func() time.Time
}

func (as *activities) get(id string) *Activity {
	if a, ok := as.m.Load(id); ok {
		return a.(*Activity)
	}
	a, _ := as.m.LoadOrStore(id, &Activity{clock: as.clock})
	return a.(*Activity)
}

// Activity returns sandbox id's activity tracker. The same pointer is returned
// until the sandbox is destroyed or purged, so callers may keep it.
func (m *Manager) Activity(id string) *Activity { return m.activity.get(id) }

// Downs is Activity(id).Downs() without making a tracker for an id that has
// none (0 then: nothing has begun to pause or stop it), so that requests for
// ids that do not exist leave nothing behind.
func (m *Manager) Downs(id string) uint64 {
	if a, ok := m.activity.m.Load(id); ok {
		return a.(*Activity).Downs()
	}
	return 0
}

// Tracked is how many sandboxes have an activity tracker in memory.
func (m *Manager) Tracked() int {
	n := 0
	m.activity.m.Range(func(any, any) bool { n++; return true })
	return n
}

// FlushActivity writes to the store, in one transaction, every last-active
// time that changed since the previous flush, the link cards read since,
// and what sandboxes under learn learned since (their EgressLearned).
func (m *Manager) FlushActivity() error {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	var (
		ids   []string
		times = map[string]time.Time{}
		acts  []*Activity
		vals  []int64
	)
	m.activity.m.Range(func(k, v any) bool {
		a := v.(*Activity)
		if n := a.last.Load(); n > a.flushed {
			id := k.(string)
			ids = append(ids, id)
			times[id] = time.Unix(0, n).UTC()
			acts = append(acts, a)
			vals = append(vals, n)
		}
		return true
	})
	cs := m.takeCards()
	for id := range cs {
		if _, ok := times[id]; !ok {
			ids = append(ids, id)
		}
	}
	m.takeLearning()
	for id := range m.learnPending {
		if _, ok := times[id]; !ok && cs[id] == nil {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	err := m.store.UpdateMany(ids, func(r *Record) {
		if t := times[r.ID]; t.After(r.LastActiveAt) {
			r.LastActiveAt = t
		}
		if c := cs[r.ID]; c != nil {
			if r.Cards == nil {
				r.Cards = map[int]Card{}
			}
			maps.Copy(r.Cards, c)
		}
		if l := m.learnPending[r.ID]; l != nil && r.Spec.Egress.Policy == EgressLearn {
			r.EgressLearned = MergeLearned(r.EgressLearned, l)
		}
	})
	if err != nil {
		m.putBackCards(cs)
		return err
	}
	clear(m.learnPending)
	for i, a := range acts {
		a.flushed = vals[i]
	}
	return nil
}

// flushActivityLogged is the activity-flush loop's step.
func (m *Manager) flushActivityLogged() {
	if err := m.FlushActivity(); err != nil {
		m.log.Warn("flushing activity", zap.Error(err))
	}
}
