package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestClusterSurvivesMemberLossAndRestart starts three members, writes,
// kills one (the cluster keeps a quorum), stops the rest and restarts all
// with their data: what was written is still there.
func TestClusterSurvivesMemberLossAndRestart(t *testing.T) {
	c := Start(t, 3)
	if got := len(c.Endpoints()); got != 3 {
		t.Fatalf("endpoints: %d, want 3", got)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, TLS: ClientTLS(c.Endpoints())})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(k, v string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := cli.Put(ctx, k, v)
		return err
	}
	get := func(k string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, k)
		if err != nil || len(resp.Kvs) == 0 {
			return "", err
		}
		return string(resp.Kvs[0].Value), nil
	}
	if err := put("a", "1"); err != nil {
		t.Fatalf("put on a healthy cluster: %v", err)
	}
	// Member 0 may have been the leader: writes proposed before the
	// others elect a new one are lost, so wait for them to have one.
	c.Kill(0)
	c.WaitHealthy()
	if err := put("b", "2"); err != nil {
		t.Fatalf("put with one member killed: %v", err)
	}
	c.Stop(1)
	c.Stop(2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err = cli.Put(ctx, "c", "3")
	cancel()
	if err == nil {
		t.Fatal("put succeeded with every member down")
	}
	for i := range 3 {
		c.Restart(i)
	}
	c.WaitHealthy()
	for k, want := range map[string]string{"a": "1", "b": "2"} {
		if got, err := get(k); err != nil || got != want {
			t.Fatalf("after restart %s = %q (%v), want %q", k, got, err, want)
		}
	}
}
