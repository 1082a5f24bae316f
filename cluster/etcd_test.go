package cluster

import (
	"context"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandwake/sandwake/internal/etcdtest"
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
