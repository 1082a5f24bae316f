package lifecycle

import (
	"fmt"
	"testing"
	"time"
)

// FlushDenials closes the denial windows that ended, as the denial loop
// does (for the external tests).
func (m *Manager) FlushDenials() { m.flushDenials() }

// OpenDenialWindows is how many sandboxes' denial windows are held.
func (m *Manager) OpenDenialWindows() int { return m.denials.open() }

// stepClock is a clock the test sets.
type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time { return c.t }

func newTestLimiter() (*denialLimiter, *stepClock) {
	c := &stepClock{t: time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)}
	return newDenialLimiter(c.now, DeniedPerWindow), c
}

func dest(i int) string { return fmt.Sprintf("198.51.100.%d:%d/udp", 1+i%250, 1000+i/250) }

// TestDenialLimiterPerDestination: a destination is logged once a window,
// again in the next one; its repeats are what the summary counts.
func TestDenialLimiterPerDestination(t *testing.T) {
	l, c := newTestLimiter()
	if ok, ended := l.admit("a", dest(0)); !ok || ended != nil {
		t.Fatalf("first denial: logged %v, ended %v; want logged, nothing ended", ok, ended)
	}
	l.note("a", "inc1", map[string]string{"tenant": "acme"})
	for i := range 9 {
		c.t = c.t.Add(time.Second)
		if ok, ended := l.admit("a", dest(0)); ok || ended != nil {
			t.Fatalf("repeat %d within the window: logged %v, ended %v", i, ok, ended)
		}
	}
	c.t = c.t.Add(DeniedWindow) // past the window
	ok, ended := l.admit("a", dest(0))
	if !ok {
		t.Fatalf("the destination in the next window is not logged")
	}
	if ended == nil {
		t.Fatalf("the next window's first denial closed no summary")
	}
	s := ended.summary
	if ended.id != "a" || ended.incarnation != "inc1" || ended.labels["tenant"] != "acme" ||
		s.Logged != 1 || s.Suppressed != 9 || s.Destinations != 1 || s.DestinationsEstimated ||
		len(s.Top) != 1 || s.Top[0] != (DeniedCount{Destination: dest(0), Count: 9}) || s.Until.Sub(s.From) != DeniedWindow {
		t.Errorf("summary %+v of %s %s %v", s, ended.id, ended.incarnation, ended.labels)
	}
	if r := s.reason(); r != "9 denials of 1 destinations not logged in 1m0s (1 logged)" {
		t.Errorf("reason %q", r)
	}
}

// TestDenialLimiterCap: of many destinations in a window, the first
// DeniedPerWindow are logged; the summary counts the rest, names the
// most denied, and the window is forgotten once it ends.
func TestDenialLimiterCap(t *testing.T) {
	for _, tc := range []struct {
		name       string
		distinct   int
		repeatTop  int // extra denials of dest(DeniedPerWindow) and dest(DeniedPerWindow+1)
		wantDest   int
		estimated  bool
		tolerance  float64
		wantTopLen int
	}{
		{"a few over", DeniedPerWindow + 40, 3, 40, false, 0, 5},
		{"tracked exactly", DeniedPerWindow + deniedTracked, 0, deniedTracked, false, 0, 5},
		{"a spray", DeniedPerWindow + 20000, 0, 20000, true, 0.05, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, c := newTestLimiter()
			logged := 0
			for i := range tc.distinct {
				if ok, _ := l.admit("a", dest(i)); ok {
					logged++
					l.note("a", "inc", nil)
				}
			}
			for range tc.repeatTop {
				l.admit("a", dest(DeniedPerWindow))
				l.admit("a", dest(DeniedPerWindow+1))
			}
			if logged != DeniedPerWindow {
				t.Fatalf("logged %d of %d destinations, want %d", logged, tc.distinct, DeniedPerWindow)
			}
			c.t = c.t.Add(DeniedWindow - time.Nanosecond)
			if got := l.sweep(); len(got) != 0 {
				t.Fatalf("a window not ended yet was closed: %+v", got)
			}
			c.t = c.t.Add(time.Nanosecond)
			got := l.sweep()
			if len(got) != 1 {
				t.Fatalf("sweep closed %d windows, want 1", len(got))
			}
			s := got[0].summary
			wantSuppressed := uint64(tc.distinct - DeniedPerWindow + 2*tc.repeatTop)
			if s.Logged != DeniedPerWindow || s.Suppressed != wantSuppressed || s.DestinationsEstimated != tc.estimated || len(s.Top) != tc.wantTopLen {
				t.Errorf("summary: logged %d suppressed %d (want %d) estimated %v top %d", s.Logged, s.Suppressed, wantSuppressed, s.DestinationsEstimated, len(s.Top))
			}
			if d := float64(s.Destinations-tc.wantDest) / float64(tc.wantDest); d > tc.tolerance || d < -tc.tolerance {
				t.Errorf("destinations %d, want %d (±%.0f%%)", s.Destinations, tc.wantDest, tc.tolerance*100)
			}
			if tc.repeatTop > 0 {
				want := []DeniedCount{{dest(DeniedPerWindow), uint64(1 + tc.repeatTop)}, {dest(DeniedPerWindow + 1), uint64(1 + tc.repeatTop)}}
				if s.Top[0] != want[0] || s.Top[1] != want[1] {
					t.Errorf("top %+v, want %+v first", s.Top, want)
				}
			}
			if n := l.open(); n != 0 {
				t.Errorf("%d windows held after the sweep", n)
			}
		})
	}
}

// TestDenialLimiterPerSandbox: one sandbox's flood takes nothing from
// another's bound; a window that suppressed nothing, or of a sandbox never
// read (gone), ends without a summary.
func TestDenialLimiterPerSandbox(t *testing.T) {
	l, c := newTestLimiter()
	for i := range 5000 {
		if ok, _ := l.admit("flood", dest(i)); ok {
			l.note("flood", "f", nil)
		}
	}
	for i := range 3 {
		if ok, _ := l.admit("quiet", dest(i)); !ok {
			t.Fatalf("denial %d of another sandbox during a flood is not logged", i)
		}
		l.note("quiet", "q", nil)
	}
	for i := range 70 {
		l.admit("gone", dest(i)) // never noted: its record was not found
	}
	c.t = c.t.Add(DeniedWindow)
	got := l.sweep()
	if len(got) != 1 || got[0].id != "flood" || got[0].summary.Suppressed != 5000-DeniedPerWindow {
		t.Fatalf("summaries %+v, want the flood's alone", got)
	}
	if n := l.open(); n != 0 {
		t.Errorf("%d windows held after the sweep", n)
	}
}

// TestDenialWindowDiesWithItsSandbox: a sandbox gone and made again
// under its id within the minute starts a window of its own: the gone
// one's spent budget does not suppress the new one's denials, and its
// destinations are never summarised into the new one's history.
func TestDenialWindowDiesWithItsSandbox(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := newDenialLimiter(func() time.Time { return now }, 3)
	for i := range 5 {
		l.admit("x", fmt.Sprintf("198.51.100.%d:443/tcp", i))
	}
	l.note("x", "old", map[string]string{"tenant": "acme"})
	l.drop("x")
	if logged, ended := l.admit("x", "198.51.100.9:443/tcp"); !logged || ended != nil {
		t.Fatalf("first denial after the id was made again: logged %v, ended window %+v; want logged, no window of the gone sandbox", logged, ended)
	}
	if n := l.open(); n != 1 {
		t.Errorf("%d windows open, want 1 (the new sandbox's)", n)
	}
}
