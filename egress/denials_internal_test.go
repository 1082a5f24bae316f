package egress

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/sandwake/sandwake/lifecycle"
)

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
	l.note("a")
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
	if ended.id != "a" ||
		s.Logged != 1 || s.Suppressed != 9 || s.Destinations != 1 || s.DestinationsEstimated ||
		len(s.Top) != 1 || s.Top[0] != (lifecycle.DeniedCount{Destination: dest(0), Count: 9}) || s.Until.Sub(s.From) != DeniedWindow {
		t.Errorf("summary %+v of %s", s, ended.id)
	}
	if r := summaryReason(&s); r != "9 denials of 1 destinations not logged in 1m0s (1 logged)" {
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
					l.note("a")
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
				want := []lifecycle.DeniedCount{{Destination: dest(DeniedPerWindow), Count: uint64(1 + tc.repeatTop)}, {Destination: dest(DeniedPerWindow + 1), Count: uint64(1 + tc.repeatTop)}}
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
			l.note("flood")
		}
	}
	for i := range 3 {
		if ok, _ := l.admit("quiet", dest(i)); !ok {
			t.Fatalf("denial %d of another sandbox during a flood is not logged", i)
		}
		l.note("quiet")
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
	l.note("x")
	l.drop("x")
	if logged, ended := l.admit("x", "198.51.100.9:443/tcp"); !logged || ended != nil {
		t.Fatalf("first denial after the id was made again: logged %v, ended window %+v; want logged, no window of the gone sandbox", logged, ended)
	}
	if n := l.open(); n != 1 {
		t.Errorf("%d windows open, want 1 (the new sandbox's)", n)
	}
}

// recorder stands for the Manager's OnDenied function: it keeps what it
// is told of the sandboxes that have a record.
type recorder struct {
	records map[string]bool
	events  []lifecycle.Event
}

func (r *recorder) record(ev lifecycle.Event) bool {
	if !r.records[ev.SandboxID] {
		return false
	}
	r.events = append(r.events, ev)
	return true
}

func (r *recorder) count(id, typ string) (n int, last lifecycle.Event) {
	for _, ev := range r.events {
		if ev.SandboxID == id && ev.Type == typ {
			n, last = n+1, ev
		}
	}
	return n, last
}

// TestDenialFloodIsSummarised: a sandbox refused 10,000 destinations in a
// minute is reported DeniedPerWindow sandbox.egress_denied events and,
// once the minute ends, one summary counting the rest: all the Manager is
// told of it. Another sandbox's denial during the flood is reported; a
// sandbox without a record gets no summary; the next minute starts over.
func TestDenialFloodIsSummarised(t *testing.T) {
	f := New(Options{})
	l, c := newTestLimiter()
	start := c.t
	f.denials = l
	rec := &recorder{records: map[string]bool{"flood": true, "quiet": true}}
	f.OnDenied(rec.record)
	deny := func(id string, i int) {
		f.reportDenied(id, lifecycle.EgressDecision{Addr: netip.AddrFrom4([4]byte{198, 51, 100, byte(1 + i%250)}), Port: uint16(1000 + i/250), Proto: "udp"})
	}

	const flood = 10000
	for i := range flood {
		deny("flood", i)
		if i == flood/2 {
			deny("quiet", 0)
		}
		if i < 70 {
			deny("gone", i)
		}
	}
	if n, _ := rec.count("flood", lifecycle.EventEgressDenied); n != DeniedPerWindow {
		t.Fatalf("%d egress_denied events of %d destinations, want %d", n, flood, DeniedPerWindow)
	}
	if n, last := rec.count("quiet", lifecycle.EventEgressDenied); n != 1 || last.Reason != "198.51.100.1:1000/udp" {
		t.Fatalf("the other sandbox's denial during the flood: %d events, last %+v", n, last)
	}
	f.flushDenials()
	if n, _ := rec.count("flood", lifecycle.EventEgressDeniedSummary); n != 0 {
		t.Fatalf("a summary before the minute ended")
	}

	c.t = c.t.Add(DeniedWindow)
	f.flushDenials()
	n, sum := rec.count("flood", lifecycle.EventEgressDeniedSummary)
	if n != 1 || sum.Denials == nil {
		t.Fatalf("%d summaries after the minute (%+v), want 1 with its counts", n, sum)
	}
	d := sum.Denials
	if d.Logged != DeniedPerWindow || d.Suppressed != flood-DeniedPerWindow || !d.DestinationsEstimated ||
		d.Destinations < (flood-DeniedPerWindow)*95/100 || d.Destinations > (flood-DeniedPerWindow)*105/100 ||
		len(d.Top) != 5 || !d.From.Equal(start) || !d.Until.Equal(start.Add(DeniedWindow)) {
		t.Errorf("summary %+v", d)
	}
	if want := fmt.Sprintf("%d denials of about %d destinations not logged in 1m0s (60 logged)", d.Suppressed, d.Destinations); sum.Reason != want {
		t.Errorf("reason %q, want %q", sum.Reason, want)
	}
	if n, _ := rec.count("quiet", lifecycle.EventEgressDeniedSummary); n != 0 {
		t.Errorf("a summary for the sandbox that suppressed nothing")
	}
	if n := l.open(); n != 0 {
		t.Errorf("%d denial windows held after they ended", n)
	}
	told := 0
	for _, ev := range rec.events {
		if ev.SandboxID == "flood" {
			told++
		}
	}
	if told != DeniedPerWindow+1 {
		t.Errorf("%d events of the flooding sandbox reported, want %d", told, DeniedPerWindow+1)
	}

	// The next minute: a destination logged before is logged again, and
	// the window goes with its sandbox's record.
	deny("flood", 0)
	if n, _ := rec.count("flood", lifecycle.EventEgressDenied); n != DeniedPerWindow+1 {
		t.Errorf("%d egress_denied events after the next minute's first denial, want %d", n, DeniedPerWindow+1)
	}
	f.ForgetDenials("flood")
	if n := l.open(); n != 0 {
		t.Errorf("%d denial windows held after the sandbox's record went", n)
	}
}
