package lifecycle

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// This file bounds what a sandbox's refused egress writes: the firewall
// reports each denied destination at most once a second, so a sandbox
// trying many destinations (a scan, a UDP spray) would otherwise append an
// event per destination, each stored, streamed and queued for every
// webhook. The limiter sits before the store: per sandbox and window of
// deniedWindow, one sandbox.egress_denied event per destination, at most
// DeniedPerWindow of them, then one sandbox.egress_denied_summary counting
// what it left out.

// EventEgressDeniedSummary: the sandbox's refused egress in one window
// went past what is logged event by event; the event's Denials counts
// what was not logged, and its reason says it in a line.
const EventEgressDeniedSummary = "sandbox.egress_denied_summary"

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
	// writing their summaries, when no denial came to close them.
	denialSweepEvery = 5 * time.Second
)

// DenialSummary is what a sandbox.egress_denied_summary event counts of
// one window of a sandbox's refused egress.
type DenialSummary struct {
	// From and Until bound the window.
	From  time.Time `json:"from"`
	Until time.Time `json:"until"`
	// Logged is how many sandbox.egress_denied events the window made.
	Logged int `json:"logged"`
	// Suppressed is how many denials (reports of a refused destination,
	// at most one a second per destination) were not logged as events.
	Suppressed uint64 `json:"suppressed"`
	// Destinations is how many distinct destinations the suppressed
	// denials were of: exact up to 256, estimated past it
	// (DestinationsEstimated).
	Destinations          int  `json:"destinations"`
	DestinationsEstimated bool `json:"destinations_estimated,omitempty"`
	// Top are the suppressed destinations denied most often, at most
	// five, most first (among the first 256 distinct ones).
	Top []DeniedCount `json:"top,omitempty"`
}

// DeniedCount is a destination ("addr:port/proto [name]", as an
// egress_denied event's reason) and how often it was denied.
type DeniedCount struct {
	Destination string `json:"destination"`
	Count       uint64 `json:"count"`
}

// denialLimiter holds each sandbox's current window. One lock: denials
// arrive from the firewall's single log reader, never a request's path.
type denialLimiter struct {
	now       func() time.Time
	perWindow int

	mu      sync.Mutex
	windows map[string]*denialWindow
	// emitMu orders what the Manager appends for one window before what
	// it appends for the next (see Manager.egressDenied, flushDenials).
	emitMu sync.Mutex
}

// denialWindow is one sandbox's window.
type denialWindow struct {
	start       time.Time
	logged      map[string]bool
	suppressed  uint64
	counts      map[string]uint64 // suppressed destinations, up to deniedTracked
	sketch      []uint64          // every suppressed destination's bit, once past deniedTracked
	incarnation string
	labels      map[string]string
	noted       bool // incarnation and labels are the sandbox's
}

// endedWindow is a window closed with denials suppressed: its summary,
// for the sandbox it was of.
type endedWindow struct {
	id          string
	incarnation string
	labels      map[string]string
	summary     DenialSummary
}

func newDenialLimiter(now func() time.Time, perWindow int) *denialLimiter {
	return &denialLimiter{now: now, perWindow: perWindow, windows: map[string]*denialWindow{}}
}

// admit reports whether the denial of dest by sandbox id is logged as an
// event, and the window of id it closed, if that window suppressed any.
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

// note records the incarnation and labels of sandbox id for its window's
// summary (the limiter runs before the record is read).
func (l *denialLimiter) note(id, incarnation string, labels map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.windows[id]; w != nil {
		w.incarnation, w.labels, w.noted = incarnation, labels, true
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
// sandbox's record was never read (it was gone).
func (w *denialWindow) end(id string) *endedWindow {
	if w.suppressed == 0 || !w.noted {
		return nil
	}
	s := DenialSummary{From: w.start, Until: w.start.Add(DeniedWindow), Logged: len(w.logged), Suppressed: w.suppressed, Destinations: len(w.counts)}
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
		s.Top = append(s.Top, DeniedCount{Destination: d, Count: n})
	}
	slices.SortFunc(s.Top, func(a, b DeniedCount) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Destination, b.Destination)
	})
	s.Top = s.Top[:min(len(s.Top), deniedTop)]
	return &endedWindow{id: id, incarnation: w.incarnation, labels: w.labels, summary: s}
}

// reason is the summary's event reason: the counts in a line.
func (s *DenialSummary) reason() string {
	about := ""
	if s.DestinationsEstimated {
		about = "about "
	}
	return fmt.Sprintf("%d denials of %s%d destinations not logged in %s (%d logged)", s.Suppressed, about, s.Destinations, s.Until.Sub(s.From), s.Logged)
}

// appendDenialSummary writes the summary event of an ended window.
func (m *Manager) appendDenialSummary(e *endedWindow) {
	ev := Event{Type: EventEgressDeniedSummary, SandboxID: e.id, Reason: e.summary.reason(), Incarnation: e.incarnation, Labels: e.labels, Denials: &e.summary}
	if _, err := m.store.AppendEvent(ev); err != nil {
		m.log.Warn("recording a summary of denied egress", zap.String("id", e.id), zap.Error(err))
	}
}

// flushDenials closes the windows that ended, writing their summaries
// (the denial loop's step).
func (m *Manager) flushDenials() {
	m.denials.emitMu.Lock()
	defer m.denials.emitMu.Unlock()
	for _, e := range m.denials.sweep() {
		m.appendDenialSummary(&e)
	}
}
