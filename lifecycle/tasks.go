package lifecycle

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultCloseTimeout bounds how long Close waits for the manager's work in
// flight (wakes, creates, pool fills, webhook deliveries, loops) once it has
// cancelled it.
const DefaultCloseTimeout = 30 * time.Second

// tasks are the goroutines doing the manager's work, each named by what it
// does, so that Close waits for them within a bound and names those it
// still waits for.
type tasks struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	next    uint64
	running map[uint64]string
}

// add registers a task doing what; done ends it (once, however often it is
// called).
func (t *tasks) add(what string) (done func()) {
	t.mu.Lock()
	if t.running == nil {
		t.running = map[uint64]string{}
	}
	t.next++
	id := t.next
	t.running[id] = what
	t.mu.Unlock()
	t.wg.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			delete(t.running, id)
			t.mu.Unlock()
			t.wg.Done()
		})
	}
}

// names are the tasks running now, sorted, a repeated one with its count:
// "pool fill web (2), wake abc".
func (t *tasks) names() string {
	t.mu.Lock()
	counts := map[string]int{}
	for _, what := range t.running {
		counts[what]++
	}
	t.mu.Unlock()
	out := make([]string, 0, len(counts))
	for _, what := range slices.Sorted(maps.Keys(counts)) {
		if n := counts[what]; n > 1 {
			what = fmt.Sprintf("%s (%d)", what, n)
		}
		out = append(out, what)
	}
	return strings.Join(out, ", ")
}

// wait waits for every task until bound, calling waiting(names) once if
// some are still running after notice; it reports whether all ended.
func (t *tasks) wait(notice, bound time.Duration, waiting func(names string)) bool {
	all := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(all)
	}()
	noticed := time.NewTimer(min(notice, bound))
	defer noticed.Stop()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		select {
		case <-all:
			return true
		case <-noticed.C:
			if names := t.names(); names != "" {
				waiting(names)
			}
		case <-deadline.C:
			return false
		}
	}
}
