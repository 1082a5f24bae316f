package cluster

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandwake/sandwake/internal/etcdtest"
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
// no transaction for an entry that is already so.
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
		if _, ok := rawEntry(t, a.cli, prefix, fmt.Sprintf("r%d", i)); !ok {
			t.Fatalf("r%d not published at start", i)
		}
	}
	var txns atomic.Int64
	icpt.set(func(ctx context.Context, method string, req any, invoke func(context.Context) error) error {
		if method == methodTxn {
			txns.Add(1)
		}
		return invoke(ctx)
	})
	// One changed record among the unchanged ones.
	src.set(record("r7", lifecycle.Paused))
	if err := a.republish(); err != nil {
		t.Fatal(err)
	}
	icpt.set(nil)
	if got := txns.Load(); got != 1 {
		t.Fatalf("a republish with 1 of %d records changed sent %d transactions, want 1", n, got)
	}
	if e, _ := rawEntry(t, a.cli, prefix, "r7"); e.State != lifecycle.Paused {
		t.Fatalf("r7 after the republish: %+v, want paused", e)
	}
}
