package egress

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file bounds what a sandbox's refused egress reports: the log
// reader (nflog.go) sees each denied destination at most once a second,
// so a sandbox trying many destinations (a scan, a UDP spray) would
// otherwise have the Manager append an event per destination, each
// stored, streamed and queued for every webhook. The firewall limits what
// it tells OnDenied, so a flood reaches no store: per sandbox and window
// of DeniedWindow, one sandbox.egress_denied event per destination, at
// most DeniedPerWindow of them, then one sandbox.egress_denied_summary
// counting what it left out.

const (
	// DeniedPerWindow bounds the sandbox.egress_denied events of one
	// sandbox in one window: its first denied destinations, each once.
	DeniedPerWindow = 60
	// DeniedWindow is the window the bound is counted over; a window
	// starts at the sandbox's first denial after the last one ended.
	DeniedWindow = time.Minute
	// deniedTracked bounds the destinations a window counts one by one
	// for the summary's Top; past it, distinct ones are estimated.
	deniedTracked = 256
	// deniedTop is how many destinations a summary names.
	deniedTop = 5
	// deniedSketchBits sizes the bitmap that estimates distinct
	// destinations past deniedTracked (linear counting: 4 KiB a window,
	// within a few percent up to about 100,000 destinations).
	deniedSketchBits = 1 << 15
	// denialSweepEvery is how often windows that ended are closed,
	// reporting their summaries, when no denial came to close them.
	denialSweepEvery = 5 * time.Second
)

// denialLimiter holds each sandbox's current window. One lock: denials
// arrive from the firewall's single log reader, never a request's path.
type denialLimiter struct {
	now       func() time.Time
	perWindow int

	mu      sync.Mutex
	windows map[string]*denialWindow
	// emitMu orders what is reported for one window before what is
	// reported for the next (see Firewall.reportDenied, flushDenials).
	emitMu sync.Mutex
}

// denialWindow is one sandbox's window.
type denialWindow struct {
	start      time.Time
	logged     map[string]bool
	suppressed uint64
	counts     map[string]uint64 // suppressed destinations, up to deniedTracked
	sketch     []uint64          // every suppressed destination's bit, once past deniedTracked
	noted      bool              // the sandbox had a record when a denial was reported
}

// endedWindow is a window closed with denials suppressed: its summary,
// for the sandbox it was of.
type endedWindow struct {
	id      string
	summary lifecycle.DenialSummary
}

func newDenialLimiter(now func() time.Time, perWindow int) *denialLimiter {
	return &denialLimiter{now: now, perWindow: perWindow, windows: map[string]*denialWindow{}}
}

// admit reports whether the denial of dest by sandbox id is reported as
// an event, and the window of id it closed, if that window suppressed any.
func (l *denialLimiter) admit(id, dest string) (bool, *endedWindow) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var ended *endedWindow
	w := l.windows[id]
	if w != nil && !now.Before(w.start.Add(DeniedWindow)) {
		ended = w.end(id)
		w = nil
	}
	if w == nil {
		w = &denialWindow{start: now, logged: map[string]bool{}, counts: map[string]uint64{}}
		l.windows[id] = w
	}
	if !w.logged[dest] && len(w.logged) < l.perWindow {
		w.logged[dest] = true
		return true, ended
	}
	w.suppress(dest)
	return false, ended
}

// note marks sandbox id's window as of a sandbox with a record, so that
// it ends with a summary (the limiter runs before the record is read).
func (l *denialLimiter) note(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.windows[id]; w != nil {
		w.noted = true
	}
}

// drop forgets sandbox id's window, summary and all: its record is gone
// (a sandbox made again under the id is another's).
func (l *denialLimiter) drop(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.windows, id)
}

// sweep closes every window that ended, forgetting it, and returns those
// that suppressed denials, by sandbox id.
func (l *denialLimiter) sweep() []endedWindow {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []endedWindow
	for id, w := range l.windows {
		if now.Before(w.start.Add(DeniedWindow)) {
			continue
		}
		delete(l.windows, id)
		if e := w.end(id); e != nil {
			out = append(out, *e)
		}
	}
	slices.SortFunc(out, func(a, b endedWindow) int { return cmp.Compare(a.id, b.id) })
	return out
}

// open is how many windows are held (for tests).
func (l *denialLimiter) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.windows)
}

func (w *denialWindow) suppress(dest string) {
	w.suppressed++
	if _, ok := w.counts[dest]; ok || len(w.counts) < deniedTracked {
		w.counts[dest]++
		return
	}
	if w.sketch == nil {
		w.sketch = make([]uint64, deniedSketchBits/64)
		for d := range w.counts {
			w.mark(d)
		}
	}
	w.mark(dest)
}

func (w *denialWindow) mark(dest string) {
	b := maphash.String(sketchSeed, dest) % deniedSketchBits
	w.sketch[b/64] |= 1 << (b % 64)
}

// sketchSeed seeds the hash of the destinations sketch: any seed will do,
// the sketch only counts.
var sketchSeed = maphash.MakeSeed()

// end is the window's summary, nil when it suppressed nothing or the
// sandbox had no record when its denials were reported (it was gone).
func (w *denialWindow) end(id string) *endedWindow {
	if w.suppressed == 0 || !w.noted {
		return nil
	}
	s := lifecycle.DenialSummary{From: w.start, Until: w.start.Add(DeniedWindow), Logged: len(w.logged), Suppressed: w.suppressed, Destinations: len(w.counts)}
	if w.sketch != nil {
		set := 0
		for _, word := range w.sketch {
			set += bits.OnesCount64(word)
		}
		zeros := max(deniedSketchBits-set, 1)
		s.Destinations = max(int(math.Round(deniedSketchBits*math.Log(float64(deniedSketchBits)/float64(zeros)))), len(w.counts))
		s.DestinationsEstimated = true
	}
	for d, n := range w.counts {
		s.Top = append(s.Top, lifecycle.DeniedCount{Destination: d, Count: n})
	}
	slices.SortFunc(s.Top, func(a, b lifecycle.DeniedCount) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Destination, b.Destination)
	})
	s.Top = s.Top[:min(len(s.Top), deniedTop)]
	return &endedWindow{id: id, summary: s}
}

// summaryReason is a summary event's reason: the counts in a line.
func summaryReason(s *lifecycle.DenialSummary) string {
	about := ""
	if s.DestinationsEstimated {
		about = "about "
	}
	return fmt.Sprintf("%d denials of %s%d destinations not logged in %s (%d logged)", s.Suppressed, about, s.Destinations, s.Until.Sub(s.From), s.Logged)
}

// event is the window's sandbox.egress_denied_summary event.
func (e *endedWindow) event() lifecycle.Event {
	return lifecycle.Event{Type: lifecycle.EventEgressDeniedSummary, SandboxID: e.id, Reason: summaryReason(&e.summary), Denials: &e.summary}
}

// deniedDestination is a denied decision as an egress_denied event's
// reason: "addr:port/proto", then the name it was looked up as.
func deniedDestination(d lifecycle.EgressDecision) string {
	dest := d.Addr.String()
	if d.Port != 0 {
		dest += ":" + strconv.Itoa(int(d.Port))
	}
	dest += "/" + d.Proto
	if d.Name != "" {
		dest += " " + d.Name
	}
	return dest
}

// reportDenied tells OnDenied's function of a destination the firewall
// refused sandbox id, within the limiter's bounds: past them it only
// counts it, for the window's summary. The limiter comes first, so a
// flood reaches the Manager (its store) no more than the bounds allow.
func (f *Firewall) reportDenied(id string, d lifecycle.EgressDecision) {
	fn := f.onDenied.Load()
	if fn == nil {
		return
	}
	dest := deniedDestination(d)
	f.denials.emitMu.Lock()
	defer f.denials.emitMu.Unlock()
	logged, ended := f.denials.admit(id, dest)
	if ended != nil {
		(*fn)(ended.event())
	}
	if logged && (*fn)(lifecycle.Event{Type: lifecycle.EventEgressDenied, SandboxID: id, Reason: dest}) {
		f.denials.note(id)
	}
}

// flushDenials closes the windows that ended, reporting their summaries
// (the sweep's step).
func (f *Firewall) flushDenials() {
	fn := f.onDenied.Load()
	f.denials.emitMu.Lock()
	defer f.denials.emitMu.Unlock()
	for _, e := range f.denials.sweep() {
		if fn != nil {
			(*fn)(e.event())
		}
	}
}

// sweepDenials runs flushDenials every denialSweepEvery until ctx ends
// (beside the log reader, which alone opens windows).
func (f *Firewall) sweepDenials(ctx context.Context) {
	t := time.NewTicker(denialSweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.flushDenials()
		}
	}
}

// OnDenied implements lifecycle.EgressObserver: fn is told of sandboxes'
// refused egress within the bounds above.
func (f *Firewall) OnDenied(fn func(ev lifecycle.Event) bool) {
	f.onDenied.Store(&fn)
}

// ForgetDenials implements lifecycle.EgressObserver: sandbox id's window
// is dropped, so a sandbox made again under the id starts one of its own.
func (f *Firewall) ForgetDenials(id string) { f.denials.drop(id) }
