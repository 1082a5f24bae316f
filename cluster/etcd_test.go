package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
)

// TestHealthStaysUpThroughARetriedCall: a request whose first try is lost
// to a leader failover and whose second try succeeds leaves Health nil
// throughout (readyz must not flap), while the lost try is counted.
func TestHealthStaysUpThroughARetriedCall(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	var icpt interceptor
	a := startNodeWith(t, ec.Endpoints(), prefix, "node-a", newMemSource(), &icpt)
	waitLive(t, a, "node-a")
	if err := a.Health(); err != nil {
		t.Fatalf("Health before: %v", err)
	}
	before := a.Stats().EtcdErrors

	drainKey := a.drainKey("node-a")
	tries := 0
	var healthOnRetry error
	icpt.set(func(ctx context.Context, method string, req any, invoke func(context.Context) error) error {
		if put, ok := req.(*etcdserverpb.PutRequest); method != methodPut || !ok || string(put.Key) != drainKey {
			return invoke(ctx)
		}
		tries++
		if tries == 1 {
			return status.Error(codes.Unavailable, "test: the leader died with the proposal")
		}
		healthOnRetry = a.Health()
		return invoke(ctx)
	})
	err := a.Drain(ctxT(t), "node-a", true)
	icpt.set(nil)
	if err != nil {
		t.Fatalf("Drain whose first try was lost: %v", err)
	}
	if tries != 2 {
		t.Fatalf("the drain mark was sent %d times, want 2", tries)
	}
	if healthOnRetry != nil {
		t.Fatalf("Health between the lost try and the retry: %v, want nil", healthOnRetry)
	}
	if err := a.Health(); err != nil {
		t.Fatalf("Health after: %v", err)
	}
	if got := a.Stats().EtcdErrors; got <= before {
		t.Fatalf("etcd errors: %d, want the lost try counted (more than %d)", got, before)
	}
}

// TestEtcdOutOfSpaceIsUnhealthy: etcd answering every write with its
// NOSPACE alarm cannot take the catalog's changes: Health and the call's
// error say etcd is failing, as when it is gone.
func TestEtcdOutOfSpaceIsUnhealthy(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	var icpt interceptor
	a := startNodeWith(t, ec.Endpoints(), prefix, "node-a", newMemSource(), &icpt)
	waitLive(t, a, "node-a")
	drainKey := a.drainKey("node-a")
	icpt.set(func(ctx context.Context, method string, req any, invoke func(context.Context) error) error {
		if put, ok := req.(*etcdserverpb.PutRequest); method == methodPut && ok && string(put.Key) == drainKey {
			return rpctypes.ErrGRPCNoSpace
		}
		return invoke(ctx)
	})
	err := a.Drain(ctxT(t), "node-a", true)
	health := a.Health()
	icpt.set(nil)
	if !errors.Is(err, ErrEtcd) || !strings.Contains(err.Error(), "database space exceeded") {
		t.Fatalf("Drain with etcd out of space: %v, want ErrEtcd with etcd's words", err)
	}
	if !errors.Is(health, ErrEtcd) {
		t.Fatalf("Health with etcd out of space: %v, want ErrEtcd", health)
	}
}

// TestHealthDoesNotFlapWhileWritesFail: with every write refused (etcd out
// of space) but leases still renewed, Health stays failing: a lease
// keepalive's answer does not clear it between the failing refreshes.
func TestHealthDoesNotFlapWhileWritesFail(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	var icpt interceptor
	a := startNodeWith(t, ec.Endpoints(), prefix, "node-a", newMemSource(), &icpt)
	waitLive(t, a, "node-a")
	nodeKey := a.nodeKey("node-a")
	var mu sync.Mutex
	var seen []error // Health as each refused refresh of the registration found it
	icpt.set(func(ctx context.Context, method string, req any, invoke func(context.Context) error) error {
		if put, ok := req.(*etcdserverpb.PutRequest); method == methodPut && ok && string(put.Key) == nodeKey {
			mu.Lock()
			seen = append(seen, a.Health())
			mu.Unlock()
			return rpctypes.ErrGRPCNoSpace
		}
		return invoke(ctx)
	})
	defer icpt.set(nil)
	// Each refresh is one TTL/3 after the last, with a keepalive between.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) >= 5, fmt.Sprintf("%d refreshes refused so far", len(seen))
	})
	mu.Lock()
	defer mu.Unlock()
	// The first refusal found Health clear; from the second refresh on
	// (each refresh tries twice: attempts 1..2 are the first) it must
	// stay failing.
	for i, h := range seen[2:] {
		if h == nil {
			t.Fatalf("Health was nil at refused refresh attempt %d of %d (it flapped): %v", i+3, len(seen), seen)
		}
	}
}
