package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// TestKubeStoreExpiry: a registration expires by this node's clock when
// its renewals stop (told as a delete), an edit of it that does not renew
// it (a label added by hand) neither revives an expired one nor extends a
// live one, and a renewal brings it back.
func TestKubeStoreExpiry(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	s := newKubeStore(KubeBackend{Namespace: "ns"}, "/sandwake/", "node-a", 2*time.Second)
	s.now = func() time.Time { return now }
	secs := int32(2)
	rv := 10
	lease := func(renewed time.Time) *coordv1.Lease {
		rv++
		holder := "node-b"
		rt := metav1.NewMicroTime(renewed)
		return &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: "sandwake-node-node-b", ResourceVersion: strconv.Itoa(rv),
				Labels:      map[string]string{LabelCatalog: "sandwake", LabelSpace: "node"},
				Annotations: map[string]string{AnnotationKey: "node-b", AnnotationValue: "{}"},
			},
			Spec: coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &rt},
		}
	}
	see := func(typ watch.EventType, l *coordv1.Lease) (event, bool) {
		k, ok := s.toKV(l)
		if !ok || !k.Leased || k.Key != "/sandwake/nodes/node-b" {
			t.Fatalf("toKV: %+v %v", k, ok)
		}
		s.reached() // an event is the API server's answer (follow)
		return s.observe(typ, l, k)
	}

	// The API server answering every half second, as the nodes'
	// renewals do.
	advance := func(d time.Duration) {
		for end := now.Add(d); now.Before(end); {
			now = now.Add(500 * time.Millisecond)
			if now.After(end) {
				now = end
			}
			s.reached()
		}
	}
	t0 := now
	if e, ok := see(watch.Added, lease(t0)); !ok || e.Deleted {
		t.Fatalf("a new registration: %+v %v, want a put", e, ok)
	}
	advance(1500 * time.Millisecond)
	if evs := s.expire(); len(evs) != 0 {
		t.Fatalf("expired within its duration: %+v", evs)
	}
	// A label added by hand: a put, but no renewal.
	if e, ok := see(watch.Modified, lease(t0)); !ok || e.Deleted {
		t.Fatalf("an edit of a live registration: %+v %v, want a put", e, ok)
	}
	advance(600 * time.Millisecond) // 2.1 s after the renewal was seen
	evs := s.expire()
	if len(evs) != 1 || !evs[0].Deleted || evs[0].KV.Key != "/sandwake/nodes/node-b" || evs[0].Prev == nil {
		t.Fatalf("after its duration unrenewed: %+v, want one delete with the value before", evs)
	}
	if e, ok := see(watch.Modified, lease(t0)); ok {
		t.Fatalf("an edit of an expired registration: %+v, want nothing (still gone)", e)
	}
	if evs := s.expire(); len(evs) != 0 {
		t.Fatalf("told expired twice: %+v", evs)
	}
	// Renewed (the node is back): a put, live for its duration again.
	if e, ok := see(watch.Modified, lease(now)); !ok || e.Deleted {
		t.Fatalf("a renewal after expiry: %+v %v, want a put", e, ok)
	}
	advance(time.Second)
	if evs := s.expire(); len(evs) != 0 {
		t.Fatalf("a renewed registration expired early: %+v", evs)
	}
	// Deleted (a clean Close): a delete; an expired one deleted is not
	// told again.
	if e, ok := see(watch.Deleted, lease(now)); !ok || !e.Deleted {
		t.Fatalf("a deleted registration: %+v %v, want a delete", e, ok)
	}
}

// TestKubeStoreBlindSpell: while the API server is out of reach (no
// answer, or one that is none: a 5xx) nobody's registration expires
// (nobody can renew; this node cannot see it), nor while it has not
// answered for half a duration (a call hanging); once it answers again,
// each registration live when the spell began gets the spell's length
// more, and then expires if still not renewed. One expired before the
// spell stays expired; a caller giving up tells nothing.
func TestKubeStoreBlindSpell(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	now := t0
	s := newKubeStore(KubeBackend{Namespace: "ns"}, "/sandwake/", "node-a", 2*time.Second)
	s.now = func() time.Time { return now }
	secs := int32(2)
	lease := func(node string, renewed time.Time) *coordv1.Lease {
		rt := metav1.NewMicroTime(renewed)
		return &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: "sandwake-node-" + node, ResourceVersion: "11",
				Labels:      map[string]string{LabelCatalog: "sandwake", LabelSpace: "node"},
				Annotations: map[string]string{AnnotationKey: node, AnnotationValue: "{}"},
			},
			Spec: coordv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: &secs, RenewTime: &rt},
		}
	}
	l := lease("node-b", t0)
	dead := lease("node-c", t0.Add(-time.Hour)) // stopped renewing long ago
	k, _ := s.toKV(l)
	s.reached()
	if _, ok := s.observe(watch.Added, l, k); !ok {
		t.Fatal("a new registration not told")
	}
	ctx := context.Background()
	note := func(err error) { noted{s: s}.note(ctx, err) }
	note(&net.OpError{Op: "dial", Err: errors.New("connection refused")})
	if s.Connected() {
		t.Fatal("connected after a call that reached nothing")
	}
	now = t0.Add(5 * time.Second)
	note(apierrors.NewInternalError(errors.New("etcd unavailable"))) // the server, not the store
	now = t0.Add(10 * time.Second)
	if evs := s.expire(); len(evs) != 0 {
		t.Fatalf("expired while blind: %+v", evs)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	noted{s: s}.note(cancelled, context.Canceled) // tells nothing
	// Sight back after a 10 s spell: node-b gets 10 s more (from t0+2s to
	// t0+12s), read by a list too; node-c stays expired.
	note(nil)
	if _, gone := s.expiredAt(l, now); gone {
		t.Fatal("a registration read right after a blind spell counted expired: its holder could not renew either")
	}
	if _, gone := s.expiredAt(dead, now); !gone {
		t.Fatal("a registration expired an hour before the blind spell counted live after it")
	}
	// The server answering every half second (as renewals do): nothing
	// expires within the duration plus the spell.
	answerUntil := func(until time.Time) {
		for now.Before(until) {
			now = now.Add(500 * time.Millisecond)
			s.reached()
			if evs := s.expire(); len(evs) != 0 && now.Before(until) {
				t.Fatalf("expired at t0+%v: %+v", now.Sub(t0), evs)
			}
		}
	}
	answerUntil(t0.Add(11500 * time.Millisecond))
	// Then silent for 1.5 s (over half a duration): nothing expires,
	// though node-b's 12 s ran out, and the silence counts as a spell.
	now = t0.Add(13 * time.Second)
	if evs := s.expire(); len(evs) != 0 {
		t.Fatalf("expired with the API server silent for 1.5 s: %+v", evs)
	}
	s.reached() // node-b: 12 s + 1.5 s
	if evs := s.expire(); len(evs) != 0 {
		t.Fatalf("expired right after a silence: %+v", evs)
	}
	now = t0.Add(13500 * time.Millisecond)
	s.reached()
	if evs := s.expire(); len(evs) != 1 || !evs[0].Deleted {
		t.Fatalf("a registration unrenewed its duration plus the spells: %+v, want it told expired", evs)
	}
	if _, gone := s.expiredAt(l, now); !gone {
		t.Fatal("the same registration read by a list: live, want expired")
	}
}

// TestKubeStoreErrors: the API server's refusals of a request are
// answers (Health stays); a refusal of the gateway's identity, a timeout,
// throttling or no answer is the store out of reach, and only the last
// three are tried again.
func TestKubeStoreErrors(t *testing.T) {
	s := newKubeStore(KubeBackend{Namespace: "ns"}, "/sandwake/", "node-a", 2*time.Second)
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	for _, tc := range []struct {
		name              string
		err               error
		answered, retried bool
	}{
		{"conflict", apierrors.NewConflict(gr, "x", errors.New("changed")), true, false},
		{"not found", apierrors.NewNotFound(gr, "x"), true, false},
		{"exists", apierrors.NewAlreadyExists(gr, "x"), true, false},
		{"gone", apierrors.NewResourceExpired("too old"), true, false},
		{"forbidden", apierrors.NewForbidden(gr, "x", errors.New("no leases in the Role")), false, false},
		{"unauthorized", apierrors.NewUnauthorized("token revoked"), false, false},
		{"timeout", apierrors.NewTimeoutError("slow", 1), false, true},
		{"throttled", apierrors.NewTooManyRequests("busy", 1), false, true},
		{"server error", apierrors.NewInternalError(errors.New("etcd")), false, true},
		{"no answer", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, false, true},
	} {
		wrapped := fmt.Errorf("publishing: %w", tc.err)
		if got := s.Answered(wrapped); got != tc.answered {
			t.Errorf("%s: Answered %v, want %v", tc.name, got, tc.answered)
		}
		if got := s.Retryable(wrapped); got != tc.retried {
			t.Errorf("%s: Retryable %v, want %v", tc.name, got, tc.retried)
		}
	}
}
