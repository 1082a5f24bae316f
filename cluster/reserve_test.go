package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestReserveOutcomeMatchesEtcd: a caller that gives up while etcd applies
// its reservation (the client disconnected) must not be told "failed"
// while the id stays held: either Reserve succeeds, or the id is free
// again for any node.
func TestReserveOutcomeMatchesEtcd(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	var icpt interceptor
	a := startNodeWith(t, ec.Endpoints(), prefix, "node-a", newMemSource(), &icpt)
	b := startNode(t, ec.Endpoints(), prefix, "node-b", newMemSource())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := a.sandboxKey("gone-client")
	icpt.set(func(rctx context.Context, method string, req any, invoke func(context.Context) error) error {
		if method != methodTxn || !isReserveTxn(req, key) {
			return invoke(rctx)
		}
		err := invoke(rctx)
		// The caller gives up just as etcd answers: gRPC reports the
		// cancellation, not the answer.
		cancel()
		if rctx.Err() != nil {
			return status.FromContextError(rctx.Err()).Err()
		}
		return err
	})
	err := a.Reserve(ctx, "gone-client", 0)
	icpt.set(nil)
	if err == nil {
		e, ok := rawEntry(t, a.etcdCli(), prefix, "gone-client")
		if !ok || e.Node != "node-a" {
			t.Fatalf("Reserve succeeded but etcd has %+v (%v)", e, ok)
		}
		return
	}
	t.Logf("Reserve: %v", err)
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		e, ok := rawEntry(t, a.etcdCli(), prefix, "gone-client")
		return !ok, fmt.Sprintf("Reserve failed but etcd still holds the id: %+v", e)
	})
	if err := b.Reserve(ctxT(t), "gone-client", 0); err != nil {
		t.Fatalf("Reserve by another node of an id whose reservation failed: %v", err)
	}
}

// TestReleaseKeepsAConcurrentReservation: a failed create releases its id
// while a second create of the same id on the same node is reserving it;
// the second reservation lands after the release and must still be kept
// from the republish (its record does not exist yet), or another node
// could reserve the id too.
func TestReleaseKeepsAConcurrentReservation(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	var icpt interceptor
	a := startNodeWith(t, ec.Endpoints(), prefix, "node-a", newMemSource(), &icpt)
	b := startNode(t, ec.Endpoints(), prefix, "node-b", newMemSource())

	if err := a.Reserve(ctxT(t), "twice", 0); err != nil {
		t.Fatal(err)
	}
	key := a.sandboxKey("twice")
	blocked, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	icpt.set(func(rctx context.Context, method string, req any, invoke func(context.Context) error) error {
		if method == methodTxn && isReserveTxn(req, key) {
			once.Do(func() { close(blocked) })
			<-proceed
		}
		return invoke(rctx)
	})
	second := make(chan error, 1)
	go func() { second <- a.Reserve(context.Background(), "twice", 0) }()
	<-blocked
	icpt.set(nil)
	// The first create failed without a record: its id is given back.
	if err := a.Release(ctxT(t), "twice"); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	if err := <-second; err != nil {
		t.Fatalf("second Reserve after the release: %v", err)
	}
	if err := a.republish(); err != nil {
		t.Fatal(err)
	}
	if e, ok := rawEntry(t, a.etcdCli(), prefix, "twice"); !ok || e.Node != "node-a" {
		t.Fatalf("after a republish the second reservation is %+v (%v), want node-a's", e, ok)
	}
	if err := b.Reserve(ctxT(t), "twice", 0); !errors.Is(err, ErrTaken) {
		t.Fatalf("Reserve by node-b of an id node-a holds: %v, want ErrTaken", err)
	}
}

// TestReserveRightAfterDestroy: a sandbox destroyed on this node whose
// entry the publisher has not deleted yet does not make a create of the
// same id right after fail as taken (by this very node); a record still
// present, or another node's entry, does.
func TestReserveRightAfterDestroy(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	src := newMemSource()
	src.set(record("again", lifecycle.Running))
	src.set(record("kept", lifecycle.Running))
	a := startNode(t, ec.Endpoints(), prefix, "node-a", src)
	b := startNode(t, ec.Endpoints(), prefix, "node-b", newMemSource())
	for _, id := range []string{"again", "kept"} {
		if _, ok := rawEntry(t, a.etcdCli(), prefix, id); !ok {
			t.Fatalf("%s not published at start", id)
		}
	}
	// Destroyed: the record is gone, the publisher not told yet.
	src.del("again")
	if err := a.Reserve(ctxT(t), "again", 64); err != nil {
		t.Fatalf("Reserve of an id destroyed here a moment ago: %v", err)
	}
	if e, ok := rawEntry(t, a.etcdCli(), prefix, "again"); !ok || e.State != lifecycle.Creating || e.MemoryMB != 64 {
		t.Fatalf("again after the Reserve: %+v (%v), want the new reservation", e, ok)
	}
	// The destroy's own publish comes late: it leaves the reservation.
	a.Changed("again")
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		return a.Stats().Pending == 0, "the destroy's publish is pending"
	})
	if e, ok := rawEntry(t, a.etcdCli(), prefix, "again"); !ok || e.State != lifecycle.Creating {
		t.Fatalf("again after the destroy's publish: %+v (%v), want the reservation kept", e, ok)
	}
	if err := a.Reserve(ctxT(t), "kept", 0); !errors.Is(err, ErrTaken) {
		t.Fatalf("Reserve of an id with a record here: %v, want ErrTaken", err)
	}
	if err := b.Reserve(ctxT(t), "kept", 0); !errors.Is(err, ErrTaken) {
		t.Fatalf("Reserve by node-b of node-a's id: %v, want ErrTaken", err)
	}
}
