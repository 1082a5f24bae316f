package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
)

// etcdStore is the cluster's store on etcd: keys under the prefix,
// transactions for compare-and-set, etcd's own leases.
type etcdStore struct {
	cli       *clientv3.Client
	endpoints string
}

// newEtcdStore makes the etcd client of cfg (it dials in the background).
func newEtcdStore(cfg Config, reqTimeout time.Duration, log *zap.Logger, dialOptions []grpc.DialOption) (*etcdStore, error) {
	endpoints := strings.Join(cfg.Endpoints, ",")
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		TLS:                  cfg.TLS,
		Username:             cfg.Username,
		Password:             cfg.Password,
		DialTimeout:          reqTimeout,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: reqTimeout,
		PermitWithoutStream:  true,
		// The client's own lines (retries, balancer) are noise next to
		// ours; keep its errors only.
		Logger: log.Named("etcd").WithOptions(zap.IncreaseLevel(zap.ErrorLevel)),
		DialOptions: append([]grpc.DialOption{
			// gRPC's default reconnect backoff grows to two minutes; a
			// node should be back within seconds of etcd.
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
				MinConnectTimeout: reqTimeout,
			}),
		}, dialOptions...),
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: etcd client for %s: %w", endpoints, err)
	}
	return &etcdStore{cli: cli, endpoints: endpoints}, nil
}

func (s *etcdStore) String() string { return "etcd at " + s.endpoints }

func (s *etcdStore) Close() error { return s.cli.Close() }

// catalogPage is how many keys one ListPage asks for: a catalog of a
// million entries (about 330 MB) is read in twenty answers of about 16 MB at
// one revision, never as one that etcd must build and hold whole. Not
// smaller: etcd 3.4 walks its index from a page's first key to the range's
// end for every page, so a page costs the keys after it, not its own.
var catalogPage int64 = 50_000

func fromEtcd(p *mvccpb.KeyValue) kv {
	return kv{Key: string(p.Key), Value: p.Value, Rev: p.ModRevision, Leased: p.Lease != 0}
}

func fromEtcdAll(kvs []*mvccpb.KeyValue) []kv {
	out := make([]kv, len(kvs))
	for i, p := range kvs {
		out[i] = fromEtcd(p)
	}
	return out
}

// ListPage reads up to catalogPage keys under prefix from cont (a key),
// at revision rev. If the revision is compacted away meanwhile, it fails
// (the caller lists again).
func (s *etcdStore) ListPage(ctx context.Context, prefix string, rev int64, cont string) ([]kv, int64, string, error) {
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	if cont != "" {
		from = cont
	}
	opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(catalogPage)}
	if rev != 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := s.cli.Get(ctx, from, opts...)
	if err != nil {
		return nil, 0, "", err
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	next := ""
	if resp.More && len(resp.Kvs) > 0 {
		next = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return fromEtcdAll(resp.Kvs), rev, next, nil
}

// Watch follows prefix from rev+1.
func (s *etcdStore) Watch(ctx context.Context, prefix string, rev int64, fn func([]event)) error {
	// WithRequireLeader: a member cut off from its leader cancels the
	// watch instead of going silent, so the catalog is loaded again from
	// a member that has one.
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	from := rev + 1
	wch := s.cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV())
	for wr := range wch {
		if wr.CompactRevision != 0 {
			return fmt.Errorf("%w: revision %d compacted (now %d)", errWatchRestart, from, wr.CompactRevision)
		}
		if err := wr.Err(); err != nil {
			return err
		}
		if wr.Canceled {
			return fmt.Errorf("%w: watch canceled by etcd", errWatchRestart)
		}
		if len(wr.Events) == 0 {
			continue
		}
		evs := make([]event, len(wr.Events))
		for i, ev := range wr.Events {
			evs[i] = event{Deleted: ev.Type == mvccpb.DELETE, KV: fromEtcd(ev.Kv)}
			if ev.PrevKv != nil {
				p := fromEtcd(ev.PrevKv)
				evs[i].Prev = &p
			}
		}
		fn(evs)
	}
	return ctx.Err()
}

// Get reads keys in one transaction.
func (s *etcdStore) Get(ctx context.Context, keys ...string) ([]kv, error) {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(k)
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	out := make([]kv, len(keys))
	for i, k := range keys {
		out[i] = kv{Key: k}
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			out[i] = fromEtcd(kvs[0])
		}
	}
	return out, nil
}

// Swap is one transaction: the comparisons, then the operation or the
// reads that tell why not.
func (s *etcdStore) Swap(ctx context.Context, key string, rev int64, op swapOp, value []byte, absent string) (swapResult, error) {
	var then []clientv3.Op
	switch op {
	case swapPut:
		then = append(then, clientv3.OpPut(key, string(value)))
	case swapDelete:
		then = append(then, clientv3.OpDelete(key))
	}
	// Compared by modification revision; absence by creation revision
	// (the key's first put), as a key absent has both at 0.
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", rev)}
	if rev == 0 {
		cmps[0] = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	orElse := []clientv3.Op{clientv3.OpGet(key)}
	if absent != "" {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(absent), "=", 0))
		orElse = append(orElse, clientv3.OpGet(absent, clientv3.WithCountOnly()))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(then...).Else(orElse...).Commit()
	if err != nil {
		return swapResult{}, err
	}
	if resp.Succeeded {
		return swapResult{Succeeded: true}, nil
	}
	res := swapResult{Cur: kv{Key: key}}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		res.Cur = fromEtcd(kvs[0])
	}
	if absent != "" && resp.Responses[1].GetResponseRange().Count > 0 {
		res.AbsentExists = true
	}
	return res, nil
}

func (s *etcdStore) Put(ctx context.Context, key string, value []byte) error {
	_, err := s.cli.Put(ctx, key, string(value))
	return err
}

func (s *etcdStore) Delete(ctx context.Context, key string) error {
	_, err := s.cli.Delete(ctx, key)
	return err
}

func (s *etcdStore) Grant(ctx context.Context, ttl time.Duration) (leaseID, error) {
	secs := int64((ttl + time.Second - 1) / time.Second)
	resp, err := s.cli.Grant(ctx, secs)
	if err != nil {
		return 0, err
	}
	return leaseID(resp.ID), nil
}

func (s *etcdStore) PutLeased(ctx context.Context, key string, value []byte, lease leaseID) error {
	_, err := s.cli.Put(ctx, key, string(value), clientv3.WithLease(clientv3.LeaseID(lease)))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("%w: %w", errLeaseLost, err)
	}
	return err
}

// KeepAlive's channel closes when etcd's keepalive stream ends (the
// lease expired or was revoked, or ctx ended).
func (s *etcdStore) KeepAlive(ctx context.Context, lease leaseID) (<-chan struct{}, error) {
	ka, err := s.cli.KeepAlive(ctx, clientv3.LeaseID(lease))
	if err != nil {
		return nil, err
	}
	lost := make(chan struct{})
	go func() {
		defer close(lost)
		// A keepalive's answer says nothing of Health: etcd renews
		// leases while it refuses every write (out of space).
		for range ka {
		}
	}()
	return lost, nil
}

func (s *etcdStore) Revoke(ctx context.Context, lease leaseID) error {
	_, err := s.cli.Revoke(ctx, clientv3.LeaseID(lease))
	return err
}

func (s *etcdStore) Connected() bool {
	return s.cli.ActiveConnection().GetState() == connectivity.Ready
}

// Answered reports whether err is etcd's own refusal (lease not found,
// compacted, …) rather than a failure to reach it.
func (s *etcdStore) Answered(err error) bool {
	var ee rpctypes.EtcdError
	if !errors.As(rpctypes.Error(err), &ee) {
		return false
	}
	switch ee.Code() {
	// ResourceExhausted: the database is over its quota (the NOSPACE
	// alarm: etcd takes no write until an operator compacts, defragments
	// and disarms) or etcd is overloaded. Either way etcd cannot do the
	// work: Health and creates must say so, as when it is gone.
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.ResourceExhausted:
		return false
	}
	return true
}

// Retryable: etcd not answering (a leader election, a member gone), not
// etcd refusing, nor etcd out of space (that lasts until an operator acts).
func (s *etcdStore) Retryable(err error) bool {
	if s.Answered(err) {
		return false
	}
	var ee rpctypes.EtcdError
	return !errors.As(rpctypes.Error(err), &ee) || ee.Code() != codes.ResourceExhausted
}
