package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// TestRemoveRacesRejoin: a lost node restarts between Remove's liveness
// check and its marks. Its running sandboxes must not stay marked killed
// in the catalog, and Remove says the node is back.
func TestRemoveRacesRejoin(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	var icpt interceptor
	a := startNodeWith(t, ec.Endpoints(), prefix, "node-a", newMemSource(), &icpt)
	srcC := newMemSource()
	c := startNode(t, ec.Endpoints(), prefix, "node-c", srcC)
	for _, id := range []string{"c1", "c2"} {
		srcC.set(record(id, lifecycle.Running))
		c.Changed(id)
	}
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		n, _ := a.Node("node-c")
		return n.Sandboxes == 2, fmt.Sprintf("node-c as seen: %+v", n)
	})
	crash(c)
	testenv.Eventually(t, testTTL+2*time.Second, func() (bool, string) {
		n, _ := a.Node("node-c")
		return !n.Live, "node-c still live"
	})

	// Remove's lookup (one read-only transaction) sees node-c gone; node-c
	// is back before Remove marks anything.
	var rejoin sync.Once
	rejoined := false
	icpt.set(func(ctx context.Context, method string, req any, invoke func(context.Context) error) error {
		err := invoke(ctx)
		if tx, ok := req.(*etcdserverpb.TxnRequest); ok && method == methodTxn && len(tx.Compare) == 0 {
			rejoin.Do(func() {
				startNode(t, ec.Endpoints(), prefix, "node-c", srcC)
				rejoined = true
			})
		}
		return err
	})
	killed, err := a.Remove(ctxT(t), "node-c")
	icpt.set(nil)
	if !rejoined {
		t.Fatal("Remove's lookup was not seen")
	}
	if err == nil || !strings.Contains(err.Error(), "registered again") {
		t.Fatalf("Remove of a node that rejoined meanwhile: %d killed, %v; want a refusal saying it is back", killed, err)
	}
	for _, id := range []string{"c1", "c2"} {
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			e, ok := rawEntry(t, a.etcdCli(), prefix, id)
			return ok && e.Node == "node-c" && e.State == lifecycle.Running,
				fmt.Sprintf("%s of the rejoined node-c in etcd: %+v (%v), want running", id, e, ok)
		})
	}
}

// TestRejoinedNodeRestoresRemovedEntries: a node removed while it was
// down, whose start's republish read the catalog before the marks, puts
// its running sandboxes back once it sees the marks.
func TestRejoinedNodeRestoresRemovedEntries(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	srcC := newMemSource()
	srcC.set(record("c1", lifecycle.Running))
	c := startNode(t, ec.Endpoints(), prefix, "node-c", srcC)
	if e, ok := rawEntry(t, c.etcdCli(), prefix, "c1"); !ok || e.State != lifecycle.Running {
		t.Fatalf("c1 after node-c's start: %+v (%v)", e, ok)
	}
	// The mark as Remove writes it, landing after node-c's republish.
	marked, err := c.updateEntry(ctxT(t), "marking c1", "c1", nil, func(cur *Entry) (*Entry, bool) {
		if cur == nil {
			return nil, false // a guess: the transaction returns etcd's
		}
		next := *cur
		next.State, next.Reason = lifecycle.Killed, ReasonNodeRemoved
		return &next, false
	})
	if err != nil || !marked {
		t.Fatalf("marking c1 removed: %v, %v", marked, err)
	}
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		e, ok := rawEntry(t, c.etcdCli(), prefix, "c1")
		return ok && e.State == lifecycle.Running && e.Reason == "test", fmt.Sprintf("c1 in etcd: %+v (%v), want running again", e, ok)
	})
}

// TestLostLeaseIsReplaced: when etcd drops the node's lease (and with it
// the node's key) the node grants a new one and registers on it; a key
// left on another lease is moved back to the node's own by the next
// refresh, so that lease's end does not take the node down.
func TestLostLeaseIsReplaced(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	a := startNode(t, ec.Endpoints(), prefix, "node-a", newMemSource())
	b := startNode(t, ec.Endpoints(), prefix, "node-b", newMemSource())
	waitLive(t, b, "node-a", "node-b")
	cli := newClient(t, ec.Endpoints())
	keyLease := func() (int64, bool) {
		resp, err := cli.Get(ctxT(t), a.nodeKey("node-a"))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0, false
		}
		return resp.Kvs[0].Lease, true
	}

	old := a.lease.Load()
	if l, ok := keyLease(); !ok || l != old || old == 0 {
		t.Fatalf("node-a's key on lease %x (%v), want its lease %x", l, ok, old)
	}
	if _, err := cli.Revoke(ctxT(t), clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		l, ok := keyLease()
		cur := a.lease.Load()
		return ok && cur != 0 && cur != old && l == cur, fmt.Sprintf("node-a's key on lease %x (%v), node-a holds %x, the revoked one was %x", l, ok, cur, old)
	})
	waitLive(t, b, "node-a", "node-b")

	other, err := cli.Grant(ctxT(t), 60)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctxT(t), a.nodeKey("node-a"))
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("node-a's key: %v", err)
	}
	if _, err := cli.Put(ctxT(t), a.nodeKey("node-a"), string(resp.Kvs[0].Value), clientv3.WithLease(other.ID)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		l, _ := keyLease()
		return l == a.lease.Load(), fmt.Sprintf("node-a's key still on lease %x, not node-a's %x", l, a.lease.Load())
	})
	if _, err := cli.Revoke(ctxT(t), other.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := keyLease(); !ok {
		t.Fatal("revoking a lease node-a does not hold deleted its key")
	}
}
