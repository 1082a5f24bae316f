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
	"sync/atomic"
	"time"

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
	now     func() time.Time

	// nodeKey is this node's registration key (Grant reads it).
	nodeKey string

	// unreachable is set by a call that did not reach the API server and
	// cleared by one that did (Connected).
	unreachable atomic.Bool

	// sight is whether this node sees the API server's answers, which
	// expiry needs (see expire).
	sight struct {
		sync.Mutex
		// blind: since a call got no answer, or none that is one (5xx,
		// 401, 403, 408, 429: Answered), until one gets one; spell is the
		// last blind spell ended (from the answer before it to the one
		// that ended it).
		blind bool
		spell [2]time.Time
		// answered is when the API server last answered.
		answered time.Time
	}

	mu sync.Mutex
	// held is the lease this store granted and not revoked, with the
	// resourceVersion of its last write (Revoke deletes only that).
	held struct {
		id   leaseID
		rv   string
		lost chan struct{}
	}
	// expiry is, for each node registration seen, when it expires unless
	// renewed: judged by this node's clock from when the renewal was seen
	// (a watch event), or from its renewTime (a list). staging is the
	// expiry a listing in pages builds.
	expiry, staging map[string]leased
	// gone holds the last renewal of registrations told as expired: an
	// edit that does not renew one does not bring it back.
	gone map[string]time.Time
}

// leased is a node registration's last revision, renewal, expiry and
// duration.
type leased struct {
	kv      kv
	renewed time.Time
	expires time.Time
	ttl     time.Duration
}

// catalogName is the LabelCatalog value of a prefix: "/sandwake/" is
// "sandwake", "/a/b/" "a.b".
func catalogName(prefix string) string {
	return strings.ReplaceAll(strings.Trim(prefix, "/"), "/", ".")
}

func newKubeStore(b KubeBackend, prefix, node string, ttl time.Duration) *kubeStore {
	return &kubeStore{b: b, prefix: prefix, catalog: catalogName(prefix), nodeKey: prefix + nodesDir + node,
		ttl: ttl, now: time.Now, expiry: map[string]leased{}}
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

// leaseClient is the part of the Leases client the store uses.
type leaseClient interface {
	Create(context.Context, *coordv1.Lease, metav1.CreateOptions) (*coordv1.Lease, error)
	Update(context.Context, *coordv1.Lease, metav1.UpdateOptions) (*coordv1.Lease, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
	Get(context.Context, string, metav1.GetOptions) (*coordv1.Lease, error)
	List(context.Context, metav1.ListOptions) (*coordv1.LeaseList, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}

func (s *kubeStore) leases() leaseClient {
	return noted{s.b.Client.CoordinationV1().Leases(s.b.Namespace), s}
}

// noted is a leaseClient that notes whether each call reached the API
// server (an answer, even a refusal) or not (Connected).
type noted struct {
	leaseClient
	s *kubeStore
}

func (n noted) note(ctx context.Context, err error) {
	if err != nil && ctx.Err() != nil {
		return // the caller gave up: nothing learnt of the API server
	}
	var st apierrors.APIStatus
	n.s.unreachable.Store(err != nil && !errors.As(err, &st))
	if err == nil || n.s.Answered(err) {
		n.s.reached()
	} else {
		n.s.lostSight()
	}
}

// lostSight notes a call that got no answer (or one that is none): a
// blind spell is on.
func (s *kubeStore) lostSight() {
	s.sight.Lock()
	defer s.sight.Unlock()
	s.sight.blind = true
}

// reached notes an answer of the API server, which may end a blind spell:
// one noted by a failed call, or a silence of half a duration or more
// (calls hanging, see expire). The spell runs from the answer before it
// (sight was lost then, not at the first call that failed), and every
// registration still live then gets the spell's length more: its holder
// could not renew meanwhile either. One expired before it stays so,
// however long the spell.
func (s *kubeStore) reached() {
	now := s.now()
	s.sight.Lock()
	since := s.sight.answered
	spell := !since.IsZero() && (s.sight.blind || now.Sub(since) >= s.ttl/2)
	s.sight.blind, s.sight.answered = false, now
	if spell {
		s.sight.spell = [2]time.Time{since, now}
	}
	s.sight.Unlock()
	if !spell {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, l := range s.expiry {
		if l.expires.After(since) {
			l.expires = l.expires.Add(now.Sub(since))
			s.expiry[k] = l
		}
	}
}

func (n noted) Create(ctx context.Context, l *coordv1.Lease, o metav1.CreateOptions) (*coordv1.Lease, error) {
	out, err := n.leaseClient.Create(ctx, l, o)
	n.note(ctx, err)
	return out, err
}

func (n noted) Update(ctx context.Context, l *coordv1.Lease, o metav1.UpdateOptions) (*coordv1.Lease, error) {
	out, err := n.leaseClient.Update(ctx, l, o)
	n.note(ctx, err)
	return out, err
}

func (n noted) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	err := n.leaseClient.Delete(ctx, name, o)
	n.note(ctx, err)
	return err
}

func (n noted) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordv1.Lease, error) {
	out, err := n.leaseClient.Get(ctx, name, o)
	n.note(ctx, err)
	return out, err
}

func (n noted) List(ctx context.Context, o metav1.ListOptions) (*coordv1.LeaseList, error) {
	out, err := n.leaseClient.List(ctx, o)
	n.note(ctx, err)
	return out, err
}

// Watch notes a failure only: a watch without an error proves nothing
// (client-go hands back an empty one when it kept failing to connect, as
// when the API server is gone); its events do (follow).
func (n noted) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	out, err := n.leaseClient.Watch(ctx, o)
	if err != nil {
		n.note(ctx, err)
	}
	return out, err
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
func parseRev(rv string) (int64, error) {
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
	r, err := parseRev(l.ResourceVersion)
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
// has expired: its renewTime (no later than now) plus its duration, or,
// after a spell blind to the API server, the end of sight plus its
// duration if later (its holder could not renew meanwhile either).
func (s *kubeStore) expiredAt(l *coordv1.Lease, now time.Time) (time.Time, bool) {
	if l.Spec.RenewTime == nil {
		return now, true
	}
	renewed := l.Spec.RenewTime.Time
	if renewed.After(now) {
		renewed = now
	}
	exp := s.afterSpell(renewed, duration(l))
	return exp, !exp.After(now)
}

// afterSpell is the expiry of a registration of duration ttl last
// renewed at renewed, read by a list: renewed plus ttl, plus the last
// blind spell's length if it was still live when the spell began and not
// renewed since it ended (as reached does for those the watch follows).
func (s *kubeStore) afterSpell(renewed time.Time, ttl time.Duration) time.Time {
	exp := renewed.Add(ttl)
	s.sight.Lock()
	spell := s.sight.spell
	s.sight.Unlock()
	if !spell[0].IsZero() && exp.After(spell[0]) && renewed.Before(spell[1]) {
		return exp.Add(spell[1].Sub(spell[0]))
	}
	return exp
}

// ListPage reads one page of the Leases under prefix (kubePage of them);
// the pages after the first continue its listing, one consistent
// snapshot. Expired registrations read as absent, as etcd deletes a
// lease's keys when it expires.
func (s *kubeStore) ListPage(ctx context.Context, prefix string, rev int64, cont string) ([]kv, int64, string, error) {
	sel, err := s.selector(prefix)
	if err != nil {
		return nil, 0, "", err
	}
	list, err := s.leases().List(ctx, metav1.ListOptions{LabelSelector: sel, Limit: kubePage, Continue: cont})
	if err != nil {
		return nil, 0, "", err
	}
	if cont == "" {
		if rev, err = parseRev(list.ResourceVersion); err != nil {
			return nil, 0, "", err
		}
	}
	now := s.now()
	whole := prefix == s.prefix
	page := make([]kv, 0, len(list.Items))
	s.mu.Lock()
	defer s.mu.Unlock()
	if whole && cont == "" {
		s.staging = map[string]leased{}
	}
	for i := range list.Items {
		l := &list.Items[i]
		k, ok := s.toKV(l)
		if !ok {
			continue
		}
		if k.Leased {
			exp, gone := s.expiredAt(l, now)
			if gone {
				// As if told expired: an edit that does not renew it
				// does not bring it back (observe).
				if s.gone == nil {
					s.gone = map[string]time.Time{}
				}
				s.gone[k.Key] = l.Spec.RenewTime.Time
				continue
			}
			if whole && s.staging != nil {
				s.staging[k.Key] = leased{kv: k, renewed: l.Spec.RenewTime.Time, expires: exp, ttl: duration(l)}
			}
		}
		page = append(page, k)
	}
	if whole && list.Continue == "" && s.staging != nil {
		// The whole listing read: a Watch follows from here.
		s.expiry, s.staging = s.staging, nil
	}
	return page, rev, list.Continue, nil
}

// Watch follows the Leases under prefix after rev. The API server ends
// every watch after a while: it is made again from the last revision seen
// (events and bookmarks), and only a revision too old (410 Gone) ends the
// Watch, with errWatchRestart. A registration not renewed for its
// duration (seen by this node's clock) is told as deleted, as etcd's lease
// expiry deletes its key.
func (s *kubeStore) Watch(ctx context.Context, prefix string, after int64, fn func([]event)) error {
	sel, err := s.selector(prefix)
	if err != nil {
		return err
	}
	tick := time.NewTicker(min(max(s.ttl/10, 100*time.Millisecond), time.Second))
	defer tick.Stop()
	last := strconv.FormatInt(after, 10)
	for {
		began := time.Now()
		w, err := s.leases().Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: last, AllowWatchBookmarks: true})
		if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
			return fmt.Errorf("%w: %w", errWatchRestart, err)
		}
		if err != nil {
			return err
		}
		err = s.follow(ctx, w, tick.C, &last, fn)
		w.Stop()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return err
		}
		// Closed by the server: watched again, not more than once a
		// second (a server that closes every watch at once is not
		// hammered).
		if time.Since(began) < time.Second && !sleep(ctx, time.Second) {
			return ctx.Err()
		}
	}
}

// follow reads watch w until it ends (nil: the server closed it, the
// caller watches again from *last) or fails.
func (s *kubeStore) follow(ctx context.Context, w watch.Interface, tick <-chan time.Time, last *string, fn func([]event)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			if evs := s.expire(); len(evs) > 0 {
				fn(evs)
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil
			}
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				if s.Answered(err) {
					s.reached()
				} else {
					s.lostSight() // a 5xx: the server is there, the store behind it not
				}
				if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
					return fmt.Errorf("%w: %w", errWatchRestart, err)
				}
				return fmt.Errorf("watching leases: %w", err)
			}
			s.reached() // the watch's events are the API server's answers
			l, ok := ev.Object.(*coordv1.Lease)
			if !ok {
				continue
			}
			if l.ResourceVersion != "" {
				*last = l.ResourceVersion
			}
			if ev.Type == watch.Bookmark {
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
		delete(s.gone, k.Key)
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
		renewed := l.Spec.RenewTime.Time
		if tracked && !renewed.After(prev.renewed) {
			// Changed but not renewed (a label added by hand): its
			// expiry stands.
			prev.kv = k
			s.expiry[k.Key] = prev
			return event{KV: k}, true
		}
		if !tracked && !renewed.After(s.gone[k.Key]) {
			// An expired registration edited, not renewed: still gone.
			return event{}, false
		}
		// Seen renewed now: its duration runs from this node's clock,
		// not the writer's.
		s.expiry[k.Key] = leased{kv: k, renewed: renewed, expires: s.now().Add(duration(l)), ttl: duration(l)}
		delete(s.gone, k.Key)
	} else {
		delete(s.expiry, k.Key)
	}
	return event{KV: k}, true
}

// expire tells the registrations whose duration ran out unrenewed as
// deleted, but only what this node could see: none while the API server
// is out of reach (nobody can renew; its holder may well be alive), none
// unless the server answered within half a duration (a call that hangs
// has not failed yet; this node's own renewals and the others' answer
// every third of one), and each later by the blind spells it lived
// through (reached).
func (s *kubeStore) expire() []event {
	now := s.now()
	s.sight.Lock()
	blind, answered := s.sight.blind, s.sight.answered
	s.sight.Unlock()
	if blind {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var evs []event
	for key, l := range s.expiry {
		if now.Before(l.expires) || now.Sub(answered) >= l.ttl/2 {
			continue
		}
		delete(s.expiry, key)
		if s.gone == nil {
			s.gone = map[string]time.Time{}
		}
		s.gone[key] = l.renewed
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
		return nil, kv{}, fmt.Errorf("lease %s/%s is not key %s of catalog %s (made by someone else?): left alone", s.b.Namespace, l.Name, key, s.catalog)
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
	// lost reads the key after a write that did not apply; a key found
	// as the comparison wanted is reported so (the write is tried again
	// by the caller, as after etcd's failed comparison).
	lost := func() (swapResult, error) {
		_, cur, err := s.get(ctx, key)
		if err != nil {
			return swapResult{}, err
		}
		if cur.Rev == want && (op == swapNone || (op == swapDelete && want == 0)) {
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
			for range 2 {
				_, err = s.leases().Create(ctx, obj, metav1.CreateOptions{})
				if !apierrors.IsAlreadyExists(err) {
					break
				}
				res, lerr := lost()
				if lerr != nil || res.Cur.Rev != 0 {
					return res, lerr
				}
				// Deleted between the create and the read: absent, as
				// the comparison wanted; create again.
			}
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
		// (lost reports an absent key as the comparison's success.)
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
	_, err := s.write(ctx, key, value, nil)
	return err
}

// write creates or updates key's Lease with value and returns its new
// resourceVersion; spec, when not nil, sets the Lease's spec (a
// registration).
func (s *kubeStore) write(ctx context.Context, key string, value []byte, spec *coordv1.LeaseSpec) (string, error) {
	obj, err := s.object(key, value)
	if err != nil {
		return "", err
	}
	if spec != nil {
		obj.Spec = *spec
	}
	for range maxCASAttempts {
		// get refuses a Lease of that name that is not this cluster's key:
		// it is never overwritten.
		cur, _, err := s.get(ctx, key)
		if err != nil {
			return "", err
		}
		if cur == nil {
			obj.ResourceVersion = ""
			made, err := s.leases().Create(ctx, obj, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return "", err
			}
			return made.ResourceVersion, nil
		}
		obj.ResourceVersion = cur.ResourceVersion
		if spec != nil && cur.Spec.AcquireTime != nil && cur.Spec.HolderIdentity != nil && spec.HolderIdentity != nil && *cur.Spec.HolderIdentity == *spec.HolderIdentity {
			obj.Spec.AcquireTime = cur.Spec.AcquireTime
		}
		done, err := s.leases().Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", err
		}
		return done.ResourceVersion, nil
	}
	return "", fmt.Errorf("writing %s: the lease kept changing under %d attempts", key, maxCASAttempts)
}

// Delete removes key's Lease as it was read (its resourceVersion the
// precondition), and only when it is this cluster's key (see get).
func (s *kubeStore) Delete(ctx context.Context, key string) error {
	for range maxCASAttempts {
		cur, _, err := s.get(ctx, key)
		if err != nil || cur == nil {
			return err
		}
		rv := cur.ResourceVersion
		err = s.leases().Delete(ctx, cur.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			continue
		}
		return err
	}
	return fmt.Errorf("deleting %s: the lease kept changing under %d attempts", key, maxCASAttempts)
}

// Grant starts a lease: nothing is written until PutLeased, but the
// node's registration is read, so that a Grant tells whether the API
// server answers (Health follows it).
func (s *kubeStore) Grant(ctx context.Context, ttl time.Duration) (leaseID, error) {
	if _, _, err := s.get(ctx, s.nodeKey); err != nil {
		return 0, err
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	id := leaseID(binary.BigEndian.Uint64(b[:])>>1) | 1
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held.lost != nil {
		close(s.held.lost)
	}
	s.held.id, s.held.rv, s.held.lost = id, "", make(chan struct{})
	return id, nil
}

// PutLeased writes the registration as the node's Lease proper: holder
// the node, duration the TTL, renewed now. There is no lease to lose on
// the API server: a registration others saw expire is renewed by the next
// write, which they see as a put.
func (s *kubeStore) PutLeased(ctx context.Context, key string, value []byte, lease leaseID) error {
	s.mu.Lock()
	ok := s.held.id == lease && lease != 0
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w (lease %d was revoked)", errLeaseLost, lease)
	}
	_, name, err := s.split(key)
	if err != nil {
		return err
	}
	secs := int32((s.ttl + time.Second - 1) / time.Second)
	t := metav1.NewMicroTime(s.now())
	spec := &coordv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &secs, RenewTime: &t, AcquireTime: &t}
	rv, err := s.write(ctx, key, value, spec)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.held.id == lease {
		s.held.rv = rv
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

// Revoke deletes the node's registration as this store last wrote it (a
// successor's write under the same name is left alone): the others see it
// leave at once.
func (s *kubeStore) Revoke(ctx context.Context, lease leaseID) error {
	s.mu.Lock()
	rv := ""
	if s.held.id == lease {
		rv = s.held.rv
		if s.held.lost != nil {
			close(s.held.lost)
		}
		s.held.id, s.held.rv, s.held.lost = 0, "", nil
	}
	s.mu.Unlock()
	if rv == "" {
		return nil
	}
	space, name, err := s.split(s.nodeKey)
	if err != nil {
		return err
	}
	err = s.leases().Delete(ctx, s.objectName(space, name), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// Connected is false after a call that did not reach the API server,
// until one does: a failing call is then not tried again (a create
// answers 503 promptly while the API server is gone).
func (s *kubeStore) Connected() bool { return !s.unreachable.Load() }

// Answered: the API server answered with a refusal of the request (4xx
// but a timeout or throttling). Not a refusal of the gateway's identity
// (401, 403: a Role without leases, a token revoked): that is the store
// out of reach as surely as a connection refused, and Health says so.
func (s *kubeStore) Answered(err error) bool {
	code := statusCode(err)
	return code >= 400 && code < 500 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests &&
		code != http.StatusUnauthorized && code != http.StatusForbidden
}

// Retryable: anything the API server did not refuse, but a refusal of the
// gateway's identity (it lasts until an operator acts).
func (s *kubeStore) Retryable(err error) bool {
	code := statusCode(err)
	return !s.Answered(err) && code != http.StatusUnauthorized && code != http.StatusForbidden
}

// statusCode is the HTTP status of an API server's answer (0: none).
func statusCode(err error) int {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return 0
	}
	return int(st.Status().Code)
}
