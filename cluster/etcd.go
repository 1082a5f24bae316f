package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"
)

// etcdFailure is the last failed etcd operation, as Health reports it.
type etcdFailure struct{ err error }

// call runs one etcd request under the request timeout and records its
// outcome for Health. Every request of the package is safe to repeat
// (compare-and-set on revisions, puts of the same value, gets), so one
// that failed for want of etcd while a member is still connected is sent
// again: a leader's death loses the proposals in flight until the
// others elect a new one, and a later try goes to the new leader (tries
// go on, with a growing pause, for up to three request timeouts). With no
// member connected it fails after one try (a create answers 503 promptly).
// Health follows the call's outcome, not its first try's: a failover
// that a later try rides out is counted as an etcd error but does not
// make the node unready for a moment. call is for requests that write;
// callRead for those that only read.
func (c *Cluster) call(ctx context.Context, what string, fn func(ctx context.Context) error) error {
	return c.do(ctx, what, true, fn)
}

// callRead is call for a request that writes nothing: its success does
// not clear a write failure from Health (etcd out of space still reads).
func (c *Cluster) callRead(ctx context.Context, what string, fn func(ctx context.Context) error) error {
	return c.do(ctx, what, false, fn)
}

func (c *Cluster) do(ctx context.Context, what string, write bool, fn func(ctx context.Context) error) error {
	if c.st == nil {
		return fmt.Errorf("%s: %w (%s): cluster not started", what, ErrEtcd, c.endpoints)
	}
	// Retries go on for up to failoverBudget while a member is connected:
	// an election after the leader's death takes one to two election
	// timeouts (1-2 s by default), longer on a loaded host, and a try
	// that fails fast ("leader changed") must not use the budget up.
	start := time.Now()
	err := c.try(ctx, fn)
	for delay := 100 * time.Millisecond; err != nil && ctx.Err() == nil && c.st.Retryable(err) &&
		time.Since(start)+delay < c.failoverBudget() && c.st.Connected(); delay *= 2 {
		c.etcdErrors.Add(1)
		if !sleep(ctx, delay) {
			break
		}
		err = c.try(ctx, fn)
	}
	return c.observe(ctx, what, write, err)
}

// failoverBudget bounds one call's retries through a leader failover.
func (c *Cluster) failoverBudget() time.Duration { return 3 * c.reqTimeout }

func (c *Cluster) try(ctx context.Context, fn func(ctx context.Context) error) error {
	rctx, cancel := context.WithTimeout(ctx, c.reqTimeout)
	defer cancel()
	return fn(rctx)
}

// observe records the outcome of an etcd request and wraps a failure:
// ErrEtcd when etcd did not answer (unreachable, no leader, timeout), the
// plain error when it answered with a refusal, the caller's own error when
// the caller gave up. A write's failure is kept apart from a read's and
// cleared only by a write that works: with every write refused and reads
// answered (etcd out of space), Health would otherwise flap between the
// two.
func (c *Cluster) observe(ctx context.Context, what string, write bool, err error) error {
	if err == nil || (ctx.Err() == nil && c.st.Answered(err)) {
		c.health.Store(nil)
		if write {
			c.writeHealth.Store(nil)
		}
		if err == nil {
			return nil
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	werr := fmt.Errorf("%s: %w (%s): %w", what, ErrEtcd, c.endpoints, err)
	if write {
		c.writeHealth.Store(&etcdFailure{err: werr})
	} else {
		c.health.Store(&etcdFailure{err: werr})
	}
	c.etcdErrors.Add(1)
	// Whatever failed, the catalog may now miss changes: republish
	// everything once etcd answers again.
	c.pub.needResync()
	return werr
}

// retryLoop runs attempt until the cluster closes: after a failure it
// waits with a growing delay and tries again; after a success it calls
// then, and stops when then reports false. first (when not nil) is closed
// after the first attempt, whatever its outcome.
func (c *Cluster) retryLoop(what string, first chan struct{}, attempt func() error, then func() bool) {
	retry := newRetryDelay(200*time.Millisecond, 3*time.Second)
	for c.ctx.Err() == nil {
		err := attempt()
		if first != nil {
			close(first)
			first = nil
		}
		if err != nil {
			c.log.Debug(what, zap.Error(err))
			if !sleep(c.ctx, retry.next()) {
				return
			}
			continue
		}
		retry.reset()
		if !then() {
			return
		}
	}
}

// retryDelay is a capped exponential backoff with jitter.
type retryDelay struct {
	min, max, cur time.Duration
}

func newRetryDelay(lo, hi time.Duration) *retryDelay { return &retryDelay{min: lo, max: hi} }

// next returns the delay before the next attempt and grows it.
func (b *retryDelay) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	return b.cur - time.Duration(rand.Int64N(int64(b.cur)/5+1))
}

// reset starts over after a success.
func (b *retryDelay) reset() { b.cur = 0 }

// sleep waits d or until ctx ends; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
