package cluster

import (
	"context"
	"errors"
	"time"
)

// kv is one key of the cluster's store as the cluster reads it.
type kv struct {
	// Key is the whole key: the prefix, a key space (nodes/, drain/,
	// sandboxes/) and a name.
	Key   string
	Value []byte
	// Rev is the key's modification revision; 0 means absent.
	Rev int64
	// Leased is whether a node's lease holds the key (a registration
	// written by its node; see checkRegistration).
	Leased bool
}

// event is one change of a key seen by store.Watch: a put, or a delete
// (Deleted, with Key and the deletion's revision in KV, and the value
// before it in Prev when the store knows it).
type event struct {
	Deleted bool
	KV      kv
	Prev    *kv
}

// swapOp is what store.Swap does when its conditions hold.
type swapOp int

const (
	swapNone   swapOp = iota // only compare (a read)
	swapPut                  // put the value
	swapDelete               // delete the key
)

// swapResult is store.Swap's answer.
type swapResult struct {
	// Succeeded: the conditions held and the operation was done.
	Succeeded bool
	// Cur is the key as it is, when the conditions did not hold (Rev 0:
	// absent).
	Cur kv
	// AbsentExists: the key that had to be absent exists.
	AbsentExists bool
}

// leaseID names a node's lease in the store (0: none).
type leaseID int64

// errWatchRestart wraps why a watch ended that says nothing of the store's
// health.
var errWatchRestart = errors.New("the watch must start again from a new listing")

// errLeaseLost is a store's answer to a put on a lease that expired or
// was revoked: the node must register again.
var errLeaseLost = errors.New("the node's lease is lost")

// store is what the cluster needs of its backend: keys with revisions, a
// list and watch of a prefix, compare-and-set on one key, and leases that
// hold a node's registration while it lives. etcd (etcdStore) and the
// Kubernetes API (kubeStore) are the two. Every call is bounded by its
// context; the Cluster adds retries and Health (see do).
type store interface {
	// ListPage reads one page of the keys under prefix: the first when
	// cont is empty, else the one cont (the last page's next) names, at
	// revision rev (0 on the first page: now). It returns the page, the
	// revision the listing reads at (a Watch continues from it) and the
	// next page's cont ("" after the last page). Each page is one request:
	// the Cluster bounds and retries each (see list).
	ListPage(ctx context.Context, prefix string, rev int64, cont string) (page []kv, at int64, next string, err error)
	// Watch calls fn with each batch of changes under prefix after rev
	// until ctx ends or the watch breaks; it returns why it ended, wrapping
	// errWatchRestart when the store is fine but the watch cannot go on
	// (its revision compacted away): the catalog is loaded again.
	Watch(ctx context.Context, prefix string, rev int64, fn func([]event)) error
	// Get reads keys at one point (absent keys have Rev 0).
	Get(ctx context.Context, keys ...string) ([]kv, error)
	// Swap does op on key (value for a put) when key's revision is rev
	// (0: absent) and, when absent is not empty, key absent does not
	// exist.
	Swap(ctx context.Context, key string, rev int64, op swapOp, value []byte, absent string) (swapResult, error)
	// Put writes key unconditionally; Delete removes it.
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
	// Grant makes a lease of ttl; PutLeased writes key under it
	// (errLeaseLost once it is gone); KeepAlive keeps it while ctx lives,
	// and its channel closes when the lease is lost; Revoke ends it and
	// removes its keys.
	Grant(ctx context.Context, ttl time.Duration) (leaseID, error)
	PutLeased(ctx context.Context, key string, value []byte, lease leaseID) error
	KeepAlive(ctx context.Context, lease leaseID) (<-chan struct{}, error)
	Revoke(ctx context.Context, lease leaseID) error
	// Answered reports whether err is the store's own refusal rather than
	// a failure to reach it; Retryable whether a try that failed so may
	// succeed soon; Connected whether the store is reachable now (retries
	// are made only then).
	Answered(err error) bool
	Retryable(err error) bool
	Connected() bool
	// String names the store and where it is, for error messages
	// ("etcd at https://10.0.0.1:2379").
	String() string
	Close() error
}
