package cluster

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// KubeBackend is the Kubernetes API as the cluster's store: every key is
// one Lease (coordination.k8s.io/v1) in Namespace. A node's registration
// is its Lease proper (holderIdentity, leaseDurationSeconds, renewTime,
// renewed with every refresh); a drain mark and a sandbox's catalog entry
// are Leases too, holding no one: the value is an annotation, the
// revision the object's resourceVersion, compare-and-set an update or
// delete with that resourceVersion. One list and watch of the namespace's
// Leases with the cluster's label follows everything, as etcd's watch of
// the prefix does.
type KubeBackend struct {
	// Client talks to the API server; its identity needs get, list,
	// watch, create, update and delete on leases in Namespace.
	Client kubernetes.Interface
	// Namespace holds the Leases (the gateways' own namespace).
	Namespace string
	// Server names the API server in messages ("https://10.96.0.1:443").
	Server string
}

func (b KubeBackend) check() error {
	if b.Client == nil {
		return errors.New("cluster: backend kubernetes has no client")
	}
	if errs := validation.IsDNS1123Label(b.Namespace); len(errs) > 0 {
		return fmt.Errorf("cluster: backend kubernetes: namespace %q: %s", b.Namespace, strings.Join(errs, "; "))
	}
	return nil
}

// String names the store for messages.
func (b KubeBackend) String() string {
	s := "the Kubernetes API"
	if b.Server != "" {
		s += " at " + b.Server
	}
	return s + ", namespace " + b.Namespace
}

// Labels and annotations of the cluster's Leases.
const (
	// LabelCatalog holds the cluster's name (its prefix without slashes):
	// clusters sharing a namespace keep apart by it.
	LabelCatalog = "sandwake.io/catalog"
	// LabelSpace is the key space: node, drain or sandbox.
	LabelSpace = "sandwake.io/space"
	// AnnotationKey is the key's name in its space (the node's name, the
	// sandbox's id); AnnotationValue its value.
	AnnotationKey   = "sandwake.io/key"
	AnnotationValue = "sandwake.io/value"
)

// spaces maps key spaces to their LabelSpace values.
var spaces = []struct{ dir, label string }{
	{nodesDir, "node"}, {drainDir, "drain"}, {sandboxesDir, "sandbox"},
}

// kubePage is how many Leases one page of a list asks for.
var kubePage int64 = 500

// kubeStore is the store on the Kubernetes API (see KubeBackend).
type kubeStore struct {
	b      KubeBackend
	prefix string
	// catalog is the LabelCatalog value of every Lease of this cluster.
	catalog string
	ttl     time.Duration
	log     *zap.Logger
	now     func() time.Time

	mu sync.Mutex
	// held is the lease this store granted and not lost, with the node
	// key it holds and when it was last renewed.
	held struct {
		id      leaseID
		key     string
		renewed time.Time
		lost    chan struct{}
	}
	// expiry is, for each node registration seen, when it expires unless
	// renewed: judged by this node's clock from when the renewal was seen
	// (a watch event), or from its renewTime (a list).
	expiry map[string]leased
}

// leased is a node registration's last revision and its expiry.
type leased struct {
	kv      kv
	expires time.Time
}

// catalogName is the LabelCatalog value of a prefix: "/sandwake/" is
// "sandwake", "/a/b/" "a.b".
func catalogName(prefix string) string {
	return strings.ReplaceAll(strings.Trim(prefix, "/"), "/", ".")
}

func newKubeStore(b KubeBackend, prefix string, ttl time.Duration, log *zap.Logger) *kubeStore {
	return &kubeStore{b: b, prefix: prefix, catalog: catalogName(prefix), ttl: ttl, log: log, now: time.Now, expiry: map[string]leased{}}
}

// checkKubePrefix refuses a prefix that makes no label value.
func checkKubePrefix(prefix string) error {
	if errs := validation.IsValidLabelValue(catalogName(prefix)); len(errs) > 0 || catalogName(prefix) == "" {
		return fmt.Errorf("cluster: prefix %q makes no Kubernetes label value (%s): use letters, digits, '-', '.' and '/'", prefix, strings.Join(errs, "; "))
	}
	return nil
}

func (s *kubeStore) String() string { return s.b.String() }

func (s *kubeStore) Close() error { return nil }

func (s *kubeStore) leases() interface {
	Create(context.Context, *coordv1.Lease, metav1.CreateOptions) (*coordv1.Lease, error)
	Update(context.Context, *coordv1.Lease, metav1.UpdateOptions) (*coordv1.Lease, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
	Get(context.Context, string, metav1.GetOptions) (*coordv1.Lease, error)
	List(context.Context, metav1.ListOptions) (*coordv1.LeaseList, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
} {
	return s.b.Client.CoordinationV1().Leases(s.b.Namespace)
}

// split cuts a key into its space's label and its name.
func (s *kubeStore) split(key string) (space, name string, err error) {
	rest, ok := strings.CutPrefix(key, s.prefix)
	if ok {
		for _, sp := range spaces {
			if n, ok := strings.CutPrefix(rest, sp.dir); ok && n != "" {
				return sp.label, n, nil
			}
		}
	}
	return "", "", fmt.Errorf("key %q is in none of the cluster's spaces", key)
}

// objectName is the Lease's name of a key: "<catalog>-<space>-<name>"
// when that is a DNS subdomain, else the name's hash in place of it (the
// name itself is in AnnotationKey either way).
func (s *kubeStore) objectName(space, name string) string {
	n := s.catalog + "-" + space + "-" + name
	if len(validation.IsDNS1123Subdomain(n)) == 0 {
		return n
	}
	h := sha256.Sum256([]byte(name))
	return strings.ToLower(strings.Trim(strings.ReplaceAll(s.catalog, ".", "-"), "-")) + "-" + space + "-h" + hex.EncodeToString(h[:12])
}

// selector selects the Leases under prefix.
func (s *kubeStore) selector(prefix string) (string, error) {
	sel := LabelCatalog + "=" + s.catalog
	if prefix == s.prefix {
		return sel, nil
	}
	for _, sp := range spaces {
		if prefix == s.prefix+sp.dir {
			return sel + "," + LabelSpace + "=" + sp.label, nil
		}
	}
	return "", fmt.Errorf("prefix %q is not one the store lists", prefix)
}

// rev parses a resourceVersion. The API calls them opaque; every API
// server on etcd gives etcd's revision, and the catalog compares them.
func rev(rv string) (int64, error) {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("resourceVersion %q is not a positive integer (an API server not on etcd?)", rv)
	}
	return n, nil
}

// toKV is the key a Lease holds; ok is false for a Lease that is not one
// of the cluster's keys.
func (s *kubeStore) toKV(l *coordv1.Lease) (kv, bool) {
	if l.Labels[LabelCatalog] != s.catalog {
		return kv{}, false
	}
	name := l.Annotations[AnnotationKey]
	if name == "" {
		return kv{}, false
	}
	var dir string
	for _, sp := range spaces {
		if l.Labels[LabelSpace] == sp.label {
			dir = sp.dir
		}
	}
	if dir == "" {
		return kv{}, false
	}
	r, err := rev(l.ResourceVersion)
	if err != nil {
		return kv{}, false
	}
	out := kv{Key: s.prefix + dir + name, Value: []byte(l.Annotations[AnnotationValue]), Rev: r}
	if dir == nodesDir {
		out.Leased = l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" &&
			l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 && l.Spec.RenewTime != nil
	}
	return out, true
}

// duration is a registration's lease duration (0: none).
func duration(l *coordv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds == nil {
		return 0
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// expiredAt reports whether a node registration read by a list or get
// has expired: its renewTime (no later than now) plus its duration.
func (s *kubeStore) expiredAt(l *coordv1.Lease, now time.Time) (time.Time, bool) {
	if l.Spec.RenewTime == nil {
		return now, true
	}
	renewed := l.Spec.RenewTime.Time
	if renewed.After(now) {
		renewed = now
	}
	exp := renewed.Add(duration(l))
	return exp, !exp.After(now)
}

// List reads every Lease under prefix in pages, one consistent snapshot
// (the first page's resourceVersion); expired registrations read as
// absent, as etcd deletes a lease's keys when it expires.
func (s *kubeStore) List(ctx context.Context, prefix string, fn func([]kv)) (int64, error) {
	sel, err := s.selector(prefix)
	if err != nil {
		return 0, err
	}
	opts := metav1.ListOptions{LabelSelector: sel, Limit: kubePage}
	var listRev int64
	now := s.now()
	expiry := map[string]leased{}
	for {
		list, err := s.leases().List(ctx, opts)
		if err != nil {
			return 0, err
		}
		if listRev == 0 {
			if listRev, err = rev(list.ResourceVersion); err != nil {
				return 0, err
			}
		}
		page := make([]kv, 0, len(list.Items))
		for i := range list.Items {
			l := &list.Items[i]
			k, ok := s.toKV(l)
			if !ok {
				continue
			}
			if k.Leased {
				exp, gone := s.expiredAt(l, now)
				if gone {
					continue
				}
				expiry[k.Key] = leased{kv: k, expires: exp}
			}
			page = append(page, k)
		}
		fn(page)
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	if prefix == s.prefix {
		s.mu.Lock()
		s.expiry = expiry
		s.mu.Unlock()
	}
	return listRev, nil
}

// Watch follows the Leases under prefix after rev. A registration not
// renewed for its duration (seen by this node's clock) is told as
// deleted, as etcd's lease expiry deletes its key.
func (s *kubeStore) Watch(ctx context.Context, prefix string, after int64, fn func([]event)) error {
	sel, err := s.selector(prefix)
	if err != nil {
		return err
	}
	w, err := s.leases().Watch(ctx, metav1.ListOptions{
		LabelSelector: sel, ResourceVersion: strconv.FormatInt(after, 10), AllowWatchBookmarks: true,
	})
	if err != nil {
		return err
	}
	defer w.Stop()
	tick := time.NewTicker(min(max(s.ttl/10, 100*time.Millisecond), time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if evs := s.expire(); len(evs) > 0 {
				fn(evs)
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				return errors.New("the API server ended the watch of leases")
			}
			switch ev.Type {
			case watch.Error:
				return fmt.Errorf("watching leases: %w", apierrors.FromObject(ev.Object))
			case watch.Bookmark:
				continue
			}
			l, ok := ev.Object.(*coordv1.Lease)
			if !ok {
				continue
			}
			k, ok := s.toKV(l)
			if !ok {
				continue
			}
			if e, ok := s.observe(ev.Type, l, k); ok {
				fn([]event{e})
			}
		}
	}
}

// observe turns one watch event into the catalog's event and keeps the
// expiry of registrations; ok is false when there is nothing to tell (a
// registration already told as expired, deleted).
func (s *kubeStore) observe(typ watch.EventType, l *coordv1.Lease, k kv) (event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, tracked := s.expiry[k.Key]
	if typ == watch.Deleted {
		delete(s.expiry, k.Key)
		if k.Leased && !tracked {
			return event{}, false // told already (expired)
		}
		e := event{Deleted: true, KV: kv{Key: k.Key, Rev: k.Rev}}
		if tracked {
			e.Prev = &prev.kv
		} else {
			e.Prev = &k
		}
		return e, true
	}
	if k.Leased {
		// Seen renewed now: its duration runs from this node's clock,
		// not the writer's.
		s.expiry[k.Key] = leased{kv: k, expires: s.now().Add(duration(l))}
	} else {
		delete(s.expiry, k.Key)
	}
	return event{KV: k}, true
}

// expire tells the registrations whose duration ran out unrenewed as
// deleted.
func (s *kubeStore) expire() []event {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var evs []event
	for key, l := range s.expiry {
		if now.Before(l.expires) {
			continue
		}
		delete(s.expiry, key)
		prev := l.kv
		evs = append(evs, event{Deleted: true, KV: kv{Key: key, Rev: l.kv.Rev}, Prev: &prev})
	}
	return evs
}

// get reads one key's Lease (nil when absent).
func (s *kubeStore) get(ctx context.Context, key string) (*coordv1.Lease, kv, error) {
	space, name, err := s.split(key)
	if err != nil {
		return nil, kv{}, err
	}
	l, err := s.leases().Get(ctx, s.objectName(space, name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, kv{Key: key}, nil
	}
	if err != nil {
		return nil, kv{}, err
	}
	k, ok := s.toKV(l)
	if !ok || k.Key != key {
		return nil, kv{}, fmt.Errorf("lease %s/%s holds no key %s of catalog %s (made by someone else?)", s.b.Namespace, l.Name, key, s.catalog)
	}
	if k.Leased {
		if _, gone := s.expiredAt(l, s.now()); gone {
			return l, kv{Key: key}, nil
		}
	}
	return l, k, nil
}

// Get reads keys one after the other (the API has no multi-object read).
func (s *kubeStore) Get(ctx context.Context, keys ...string) ([]kv, error) {
	out := make([]kv, len(keys))
	for i, key := range keys {
		_, k, err := s.get(ctx, key)
		if err != nil {
			return nil, err
		}
		out[i] = k
	}
	return out, nil
}

// object is the Lease of key with value, as written.
func (s *kubeStore) object(key string, value []byte) (*coordv1.Lease, error) {
	space, name, err := s.split(key)
	if err != nil {
		return nil, err
	}
	return &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:        s.objectName(space, name),
			Namespace:   s.b.Namespace,
			Labels:      map[string]string{LabelCatalog: s.catalog, LabelSpace: space, "app.kubernetes.io/managed-by": "sandwake"},
			Annotations: map[string]string{AnnotationKey: name, AnnotationValue: string(value)},
		},
	}, nil
}

// Swap is compare-and-set on one Lease: a create when rev is 0, else an
// update or a delete with rev as its resourceVersion precondition. The
// API has no transaction over two objects: the absent key is read first,
// so a write racing its creation can land (etcd refuses it). The cluster
// tolerates that (see Remove and reclaim).
func (s *kubeStore) Swap(ctx context.Context, key string, want int64, op swapOp, value []byte, absent string) (swapResult, error) {
	if absent != "" {
		_, a, err := s.get(ctx, absent)
		if err != nil {
			return swapResult{}, err
		}
		if a.Rev != 0 {
			_, cur, err := s.get(ctx, key)
			if err != nil {
				return swapResult{}, err
			}
			return swapResult{Cur: cur, AbsentExists: true}, nil
		}
	}
	lost := func() (swapResult, error) {
		_, cur, err := s.get(ctx, key)
		if err != nil {
			return swapResult{}, err
		}
		if cur.Rev == want && op == swapNone {
			return swapResult{Succeeded: true}, nil
		}
		return swapResult{Cur: cur}, nil
	}
	switch op {
	case swapNone:
		return lost()
	case swapPut:
		obj, err := s.object(key, value)
		if err != nil {
			return swapResult{}, err
		}
		if want == 0 {
			_, err = s.leases().Create(ctx, obj, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return lost()
			}
		} else {
			obj.ResourceVersion = strconv.FormatInt(want, 10)
			_, err = s.leases().Update(ctx, obj, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return lost()
			}
		}
		if err != nil {
			return swapResult{}, err
		}
		return swapResult{Succeeded: true}, nil
	case swapDelete:
		if want == 0 {
			return lost() // deleting an absent key: done if it is absent
		}
		space, name, err := s.split(key)
		if err != nil {
			return swapResult{}, err
		}
		rv := strconv.FormatInt(want, 10)
		err = s.leases().Delete(ctx, s.objectName(space, name), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return lost()
		}
		if err != nil {
			return swapResult{}, err
		}
		return swapResult{Succeeded: true}, nil
	}
	return swapResult{}, fmt.Errorf("swap: unknown operation %d", op)
}

// Put writes key whatever it holds: an update of the current object, or
// a create.
func (s *kubeStore) Put(ctx context.Context, key string, value []byte) error {
	return s.write(ctx, key, value, nil)
}

// write creates or updates key's Lease with value; spec, when not nil,
// sets the Lease's spec (a registration).
func (s *kubeStore) write(ctx context.Context, key string, value []byte, spec *coordv1.LeaseSpec) error {
	obj, err := s.object(key, value)
	if err != nil {
		return err
	}
	if spec != nil {
		obj.Spec = *spec
	}
	for range maxCASAttempts {
		cur, err := s.leases().Get(ctx, obj.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			obj.ResourceVersion = ""
			_, err = s.leases().Create(ctx, obj, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			return err
		case err != nil:
			return err
		}
		obj.ResourceVersion = cur.ResourceVersion
		if spec != nil && cur.Spec.AcquireTime != nil && cur.Spec.HolderIdentity != nil && spec.HolderIdentity != nil && *cur.Spec.HolderIdentity == *spec.HolderIdentity {
			obj.Spec.AcquireTime = cur.Spec.AcquireTime
		}
		_, err = s.leases().Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue
		}
		return err
	}
	return fmt.Errorf("writing %s: the lease kept changing under %d attempts", key, maxCASAttempts)
}

func (s *kubeStore) Delete(ctx context.Context, key string) error {
	space, name, err := s.split(key)
	if err != nil {
		return err
	}
	err = s.leases().Delete(ctx, s.objectName(space, name), metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Grant starts a lease: nothing is written until PutLeased.
func (s *kubeStore) Grant(ctx context.Context, ttl time.Duration) (leaseID, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	id := leaseID(binary.BigEndian.Uint64(b[:]) >> 1)
	if id == 0 {
		id = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held.lost != nil && s.held.id != 0 {
		close(s.held.lost)
	}
	s.held.id, s.held.key, s.held.renewed, s.held.lost = id, "", s.now(), make(chan struct{})
	return id, nil
}

// PutLeased writes the registration as the node's Lease proper: holder
// the node, duration the TTL, renewed now. A lease not renewed within its
// TTL is lost (the others saw it expire), as is one revoked.
func (s *kubeStore) PutLeased(ctx context.Context, key string, value []byte, lease leaseID) error {
	now := s.now()
	s.mu.Lock()
	ok := s.held.id == lease && lease != 0 && now.Sub(s.held.renewed) < s.ttl
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w (lease %d, not renewed within %s)", errLeaseLost, lease, s.ttl)
	}
	_, name, err := s.split(key)
	if err != nil {
		return err
	}
	secs := int32((s.ttl + time.Second - 1) / time.Second)
	t := metav1.NewMicroTime(now)
	spec := &coordv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &secs, RenewTime: &t, AcquireTime: &t}
	if err := s.write(ctx, key, value, spec); err != nil {
		return err
	}
	s.mu.Lock()
	if s.held.id == lease {
		s.held.key, s.held.renewed = key, now
	}
	s.mu.Unlock()
	return nil
}

// KeepAlive's channel closes when the lease is revoked or replaced; the
// renewal itself is the registration's refresh (PutLeased, every TTL/3).
func (s *kubeStore) KeepAlive(ctx context.Context, lease leaseID) (<-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held.id != lease || s.held.lost == nil {
		return nil, fmt.Errorf("%w (lease %d)", errLeaseLost, lease)
	}
	return s.held.lost, nil
}

// Revoke deletes the node's registration: the others see it leave at
// once.
func (s *kubeStore) Revoke(ctx context.Context, lease leaseID) error {
	s.mu.Lock()
	key := ""
	if s.held.id == lease {
		key = s.held.key
		if s.held.lost != nil {
			close(s.held.lost)
		}
		s.held.id, s.held.key, s.held.lost = 0, "", nil
	}
	s.mu.Unlock()
	if key == "" {
		return nil
	}
	return s.Delete(ctx, key)
}

// Connected is always true: client-go keeps no connection state to ask;
// a call's own failure tells.
func (s *kubeStore) Connected() bool { return true }

// Answered: the API server answered with a refusal of the request (4xx
// but a timeout or throttling), or the lease was lost.
func (s *kubeStore) Answered(err error) bool {
	if errors.Is(err, errLeaseLost) {
		return true
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	code := int(st.Status().Code)
	return code >= 400 && code < 500 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests
}

// Retryable: anything the API server did not refuse.
func (s *kubeStore) Retryable(err error) bool { return !s.Answered(err) }
