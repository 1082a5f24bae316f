package lifecycle

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestActivityHandOff: a request registered with Enter and a pause or stop
// marked with beginDown exclude each other, and a route read before a pause
// or stop is refused after it.
func TestActivityHandOff(t *testing.T) {
	tests := []struct {
		name      string
		open      int  // exchanges open before
		force     bool // a forced beginDown (API, expiry)
		wantDown  bool // beginDown succeeds
		wantEnter bool // Enter during the down window succeeds
	}{
		{name: "idle: the stop goes first", open: 0, wantDown: true},
		{name: "in use: the stop backs off", open: 1, wantDown: false, wantEnter: true},
		{name: "in use, forced: the stop goes first", open: 2, force: true, wantDown: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &Activity{clock: time.Now}
			downs := a.Downs()
			for range tt.open {
				if !a.Enter(downs) {
					t.Fatal("Enter refused on an idle sandbox")
				}
			}
			if got := a.beginDown(tt.force); got != tt.wantDown {
				t.Fatalf("beginDown = %v, want %v", got, tt.wantDown)
			}
			if got := a.OpenConnections(); got != int64(tt.open) {
				t.Fatalf("open connections = %d, want %d", got, tt.open)
			}
			if got := a.Enter(downs); got != tt.wantEnter {
				t.Fatalf("Enter during the window = %v, want %v", got, tt.wantEnter)
			}
			if tt.wantDown {
				if !a.GoingDown() {
					t.Fatal("not going down")
				}
				a.endDown()
				if a.Enter(downs) {
					t.Fatal("Enter with the downs read before the stop succeeded after it")
				}
				if !a.Enter(a.Downs()) {
					t.Fatal("Enter with fresh downs refused after the stop ended")
				}
			}
		})
	}
}

// TestActivityHandOffRace: under the race detector, requests entering and
// finishing in a loop never overlap a successful beginDown.
func TestActivityHandOffRace(t *testing.T) {
	a := &Activity{clock: time.Now}
	var down atomic.Bool
	var overlaps, entered, downsDone atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if a.Enter(a.Downs()) {
					entered.Add(1)
					if down.Load() {
						overlaps.Add(1)
					}
					a.Finish()
				}
			}
		})
	}
	for downsDone.Load() < 2000 || entered.Load() < 2000 {
		if a.beginDown(false) {
			down.Store(true)
			downsDone.Add(1)
			down.Store(false)
			a.endDown()
		}
	}
	close(stop)
	wg.Wait()
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d requests entered while a stop was under way (%d entered, %d stops)", n, entered.Load(), downsDone.Load())
	}
	if a.OpenConnections() != 0 || a.GoingDown() {
		t.Fatalf("left open %d, going down %v", a.OpenConnections(), a.GoingDown())
	}
}
