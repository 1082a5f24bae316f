package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestPendingCountsEachIDOnce: an id marked again while its publish is in
// flight is one change waiting, not two (the catalog lag metric).
func TestPendingCountsEachIDOnce(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var p publisher
	p.init()
	p.inflight["a"] = at
	p.inflight["b"] = at.Add(time.Second)
	p.dirty["b"] = at.Add(2 * time.Second)
	p.dirty["c"] = at.Add(3 * time.Second)
	n, oldest := p.pending()
	if n != 3 || !oldest.Equal(at) {
		t.Fatalf("pending = %d since %s; want 3 (a, b, c) since %s", n, oldest, at)
	}
}

// TestRepublishOfAnUnchangedCatalogWritesNothing: a republish (run after
// every etcd failure) compares with the catalog it has just read and sends
// no transaction for an entry that is already so: of 20 entries with one
// record changed, only the changed one is written.
func TestRepublishOfAnUnchangedCatalogWritesNothing(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	src := newMemSource()
	const n = 20
	for i := range n {
		src.set(record(fmt.Sprintf("r%d", i), lifecycle.Running))
	}
	var icpt interceptor
	a := startNodeWith(t, ec.Endpoints(), prefix, "node-a", src, &icpt)
	for i := range n {
		if _, ok := rawEntry(t, a.etcdCli(), prefix, fmt.Sprintf("r%d", i)); !ok {
			t.Fatalf("r%d not published at start", i)
		}
	}
	// Transactions writing an entry other than r7's: the republish must
	// send none (r7's may come from it or from the owner's own repair of
	// an entry that differs from its record, which may run meanwhile).
	var others atomic.Int64
	var seen sync.Map
	changed := prefix + sandboxesDir + "r7"
	icpt.set(func(ctx context.Context, method string, req any, invoke func(context.Context) error) error {
		if method == methodTxn {
			for _, k := range txnWrites(req) {
				if strings.HasPrefix(k, prefix+sandboxesDir) && k != changed {
					others.Add(1)
					seen.Store(k, true)
				}
			}
		}
		return invoke(ctx)
	})
	// One changed record among the unchanged ones.
	src.set(record("r7", lifecycle.Paused))
	if err := a.republish(); err != nil {
		t.Fatal(err)
	}
	icpt.set(nil)
	if got := others.Load(); got != 0 {
		var keys []string
		seen.Range(func(k, _ any) bool { keys = append(keys, k.(string)); return true })
		t.Fatalf("a republish with 1 of %d records changed wrote %d unchanged entries (%v), want none", n, got, keys)
	}
	if e, _ := rawEntry(t, a.etcdCli(), prefix, "r7"); e.State != lifecycle.Paused {
		t.Fatalf("r7 after the republish: %+v, want paused", e)
	}
}

// failingList is a Source whose List fails a number of times first.
type failingList struct {
	*memSource
	failures atomic.Int32
}

func (s *failingList) List(state lifecycle.State) ([]lifecycle.Record, error) {
	if s.failures.Add(-1) >= 0 {
		return nil, errors.New("test: the store cannot list")
	}
	return s.memSource.List(state)
}

// TestRepublishRetriesAFailedList: the start's republish meets a local
// store that cannot list for a moment; it is tried again, so the records
// reach the catalog without waiting for an etcd failure or a restart.
func TestRepublishRetriesAFailedList(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	src := &failingList{memSource: newMemSource()}
	src.failures.Store(2)
	src.set(record("before-start", lifecycle.Running))
	a := startNode(t, ec.Endpoints(), prefix, "node-a", src)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		e, ok := rawEntry(t, a.etcdCli(), prefix, "before-start")
		return ok && e.State == lifecycle.Running, fmt.Sprintf("before-start in etcd: %+v (%v)", e, ok)
	})
	if err := a.Health(); err != nil {
		t.Fatalf("Health after a local store failure: %v, want nil (etcd answered)", err)
	}
}

// failingGet is a Source whose Get of one id fails a number of times first.
type failingGet struct {
	*memSource
	id       string
	failures atomic.Int32
}

func (s *failingGet) Get(id string) (lifecycle.Record, error) {
	if id == s.id && s.failures.Add(-1) >= 0 {
		return lifecycle.Record{}, errors.New("test: the store cannot read")
	}
	return s.memSource.Get(id)
}

// TestPublishCatchesUpAFailedRead: a change whose record cannot be read
// when its turn comes still reaches the catalog (by a republish), without
// waiting for an etcd failure or a restart.
func TestPublishCatchesUpAFailedRead(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	src := &failingGet{memSource: newMemSource(), id: "unreadable"}
	a := startNode(t, ec.Endpoints(), prefix, "node-a", src)
	src.failures.Store(1)
	src.set(record("unreadable", lifecycle.Running))
	a.Changed("unreadable")
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		e, ok := rawEntry(t, a.etcdCli(), prefix, "unreadable")
		return ok && e.State == lifecycle.Running, fmt.Sprintf("unreadable in etcd: %+v (%v)", e, ok)
	})
}
