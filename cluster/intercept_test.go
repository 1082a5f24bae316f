package cluster

import (
	"context"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// interceptor lets a test step into a node's etcd calls: fn sees every
// attempt of every unary call (after the client's own retries decided to
// send it) and runs it with invoke, or not, or fails it.
type interceptor struct {
	mu sync.Mutex
	fn func(ctx context.Context, method string, req any, invoke func(context.Context) error) error
}

// set installs fn (nil: calls pass untouched).
func (i *interceptor) set(fn func(ctx context.Context, method string, req any, invoke func(context.Context) error) error) {
	i.mu.Lock()
	i.fn = fn
	i.mu.Unlock()
}

func (i *interceptor) dialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		invoke := func(ctx context.Context) error { return invoker(ctx, method, req, reply, cc, opts...) }
		i.mu.Lock()
		fn := i.fn
		i.mu.Unlock()
		if fn == nil {
			return invoke(ctx)
		}
		return fn(ctx, method, req, invoke)
	})
}

// The methods of etcd's KV service the tests pick out.
const (
	methodTxn = "/etcdserverpb.KV/Txn"
	methodPut = "/etcdserverpb.KV/Put"
)

// isReserveTxn reports whether req is a Reserve of key (a transaction on
// "create revision of key is 0").
func isReserveTxn(req any, key string) bool {
	tx, ok := req.(*etcdserverpb.TxnRequest)
	return ok && len(tx.Compare) == 1 && tx.Compare[0].Target == etcdserverpb.Compare_CREATE && string(tx.Compare[0].Key) == key
}

// txnWrites are the keys a transaction request puts or deletes (nil for
// any other request).
func txnWrites(req any) []string {
	tx, ok := req.(*etcdserverpb.TxnRequest)
	if !ok {
		return nil
	}
	var keys []string
	for _, ops := range [][]*etcdserverpb.RequestOp{tx.Success, tx.Failure} {
		for _, op := range ops {
			if p := op.GetRequestPut(); p != nil {
				keys = append(keys, string(p.Key))
			}
			if d := op.GetRequestDeleteRange(); d != nil {
				keys = append(keys, string(d.Key))
			}
		}
	}
	return keys
}
