package lifecycle

import "sync"

// workQueue is a de-duplicating queue of sandbox ids, drained by a few
// workers (the pattern of controller-runtime's workqueue): an id added while
// it waits is not queued twice, and an id added while a worker processes it
// is processed once more afterwards (the change may have come after the
// worker's read), never by two workers at once. A burst of engine events
// (a daemon restart reports every container) thus costs one reconcile per
// sandbox and a bounded number of goroutines.
type workQueue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	queue      []string
	dirty      map[string]bool // queued, or to be queued again after processing
	processing map[string]bool
	shutdown   bool
}

func newWorkQueue() *workQueue {
	q := &workQueue{dirty: map[string]bool{}, processing: map[string]bool{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// add queues id unless it is queued already. It never blocks.
func (q *workQueue) add(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shutdown || q.dirty[id] {
		return
	}
	q.dirty[id] = true
	if q.processing[id] {
		return // queued again by done
	}
	q.queue = append(q.queue, id)
	q.cond.Signal()
}

// get waits for an id to process; ok is false once the queue is shut down.
// The caller must call done(id) when finished.
func (q *workQueue) get() (id string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.queue) == 0 && !q.shutdown {
		q.cond.Wait()
	}
	if q.shutdown {
		return "", false
	}
	id, q.queue = q.queue[0], q.queue[1:]
	q.processing[id] = true
	delete(q.dirty, id)
	return id, true
}

// done ends the processing of id, queueing it again if it was added meanwhile.
func (q *workQueue) done(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, id)
	if q.dirty[id] && !q.shutdown {
		q.queue = append(q.queue, id)
		q.cond.Signal()
	}
}

// len is the number of ids waiting.
func (q *workQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// close wakes every worker and makes get return false; queued ids are
// dropped (the next full reconcile covers them).
func (q *workQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shutdown = true
	q.cond.Broadcast()
}
