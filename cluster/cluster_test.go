package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/internal/testenv"
	"github.com/sandwake/sandwake/lifecycle"
)

// testTTL is the nodes' lease in tests: a lost node shows within seconds.
const testTTL = 2 * time.Second

// memSource is an in-memory Source: the node's records as a test sets them.
type memSource struct {
	mu   sync.Mutex
	recs map[string]lifecycle.Record
	capa Capacity
}

func newMemSource() *memSource { return &memSource{recs: map[string]lifecycle.Record{}} }

func (s *memSource) Get(id string) (lifecycle.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok {
		return lifecycle.Record{}, fmt.Errorf("sandbox %s: %w", id, lifecycle.ErrNotFound)
	}
	return r, nil
}

func (s *memSource) List(state lifecycle.State) ([]lifecycle.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []lifecycle.Record
	for _, r := range s.recs {
		if state == "" || r.State == state {
			out = append(out, r)
		}
	}
	return out, nil
}

func (s *memSource) Capacity() Capacity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.capa
}

func (s *memSource) set(r lifecycle.Record) {
	s.mu.Lock()
	s.recs[r.ID] = r
	s.mu.Unlock()
}

func (s *memSource) del(id string) {
	s.mu.Lock()
	delete(s.recs, id)
	s.mu.Unlock()
}

func (s *memSource) setCapacity(c Capacity) {
	s.mu.Lock()
	s.capa = c
	s.mu.Unlock()
}

func record(id string, state lifecycle.State) lifecycle.Record {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return lifecycle.Record{
		ID:          id,
		Spec:        lifecycle.Spec{Image: "img", Ports: []int{8080}, MemoryMB: 256, Access: "private"},
		State:       state,
		Reason:      "test",
		CreatedAt:   at,
		StateSince:  at.Add(time.Duration(len(state)) * time.Second),
		Incarnation: "inc-" + id,
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testPrefix is a key prefix of its own for each test.
func testPrefix() string { return "/sw-test-" + randomHex(4) + "/" }

// startNode starts node name on the etcd cluster under prefix; it is
// closed when the test ends.
func startNode(t testing.TB, endpoints []string, prefix, name string, src Source) *Cluster {
	t.Helper()
	return startNodeWith(t, endpoints, prefix, name, src, nil)
}

// startNodeWith is startNode with an interceptor on the node's etcd calls
// (nil: none).
func startNodeWith(t testing.TB, endpoints []string, prefix, name string, src Source, icpt *interceptor) *Cluster {
	t.Helper()
	cfg := testConfig(t, prefix, name)
	cfg.Endpoints, cfg.TLS = endpoints, etcdtest.ClientTLS(endpoints)
	return startConfig(t, cfg, src, func(c *Cluster) {
		if icpt != nil {
			c.dialOptions = append(c.dialOptions, icpt.dialOption())
		}
	})
}

// testConfig is a test node's config but its store's.
func testConfig(t testing.TB, prefix, name string) Config {
	return Config{
		Node:      name,
		Advertise: name + ".test:8080",
		Peers:     testPeers(t, name),
		Secret:    []byte("s3cret"),
		Prefix:    prefix,
		LeaseTTL:  testTTL,
		Logger:    zaptest.NewLogger(t).Named(name),
	}
}

// startConfig starts a node of cfg (before calls prepare on it, when not
// nil); it is closed when the test ends.
func startConfig(t testing.TB, cfg Config, src Source, prepare func(*Cluster)) *Cluster {
	t.Helper()
	c, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startTimeout bounds a test node's start (benchmarks over large catalogs
// raise it).
var startTimeout = 10 * time.Second

// crash stops c the way a killed process does: its goroutines stop and its
// connection closes, but its lease is not revoked.
func crash(c *Cluster) {
	c.closeOnce.Do(func() {
		c.cancel()
		c.wg.Wait()
		_ = c.st.Close()
	})
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func liveNames(c *Cluster) []string {
	var out []string
	for _, n := range c.Nodes() {
		if n.Live {
			out = append(out, n.Name)
		}
	}
	return out
}

func waitLive(t *testing.T, c *Cluster, want ...string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		got := liveNames(c)
		return slices.Equal(got, want), fmt.Sprintf("%s sees live nodes %v, want %v", c.Self(), got, want)
	})
}

// rawEntry reads id's entry straight from etcd.
func rawEntry(t *testing.T, cli *clientv3.Client, prefix, id string) (Entry, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix+sandboxesDir+id)
	if err != nil {
		t.Fatalf("reading entry %s: %v", id, err)
	}
	if len(resp.Kvs) == 0 {
		return Entry{}, false
	}
	e, err := testSigner.decodeEntry(id, fromEtcd(resp.Kvs[0]))
	if err != nil {
		t.Fatal(err)
	}
	return e, true
}

// testSigner signs and checks entries as the test nodes (secret s3cret) do.
var testSigner = func() *Cluster {
	c := &Cluster{cfg: Config{Secret: []byte("s3cret")}, log: zap.NewNop()}
	c.ekey = c.entryKey()
	return c
}()

// sealed is e as a test node writes it, signed.
func sealed(e Entry) []byte {
	b, err := testSigner.sealEntry(e)
	if err != nil {
		panic(err)
	}
	return b
}

func newClient(t testing.TB, endpoints []string) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, TLS: etcdtest.ClientTLS(endpoints)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func TestReserveIsUniqueAcrossNodes(t *testing.T) {
	eachBackend(t, func(t *testing.T, be testBackend) {
		prefix := testPrefix()
		nodes := []*Cluster{
			be.start(t, prefix, "node-a", newMemSource()),
			be.start(t, prefix, "node-b", newMemSource()),
			be.start(t, prefix, "node-c", newMemSource()),
		}
		const n = 100
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = nodes[i%3].Reserve(context.Background(), "same-id", 128)
			}()
		}
		close(start)
		wg.Wait()
		won, taken := -1, 0
		for i, err := range errs {
			switch {
			case err == nil:
				if won >= 0 {
					t.Fatalf("Reserve succeeded twice (calls %d and %d)", won, i)
				}
				won = i
			case errors.Is(err, ErrTaken):
				taken++
			default:
				t.Fatalf("Reserve %d: %v", i, err)
			}
		}
		if won < 0 || taken != n-1 {
			t.Fatalf("Reserve: winner %d, %d taken; want one winner and %d taken", won, taken, n-1)
		}
		owner := nodes[won%3].Self()
		for _, c := range nodes {
			testenv.Eventually(t, 5*time.Second, func() (bool, string) {
				e, ok := c.Lookup("same-id")
				return ok && e.Node == owner && e.State == lifecycle.Creating && e.MemoryMB == 128,
					fmt.Sprintf("%s sees %+v (%v), want a creating entry of %s", c.Self(), e, ok, owner)
			})
		}
		// The winner's republish keeps the reservation although no record
		// exists yet; Release removes it.
		winner := nodes[won%3]
		if err := winner.republish(); err != nil {
			t.Fatal(err)
		}
		if _, ok := be.entry(t, prefix, "same-id"); !ok {
			t.Fatal("a republish deleted a reservation")
		}
		// Release by a node that does not hold it leaves it alone.
		if err := nodes[(won+1)%3].Release(ctxT(t), "same-id"); err != nil {
			t.Fatal(err)
		}
		if _, ok := be.entry(t, prefix, "same-id"); !ok {
			t.Fatal("another node's Release deleted the entry")
		}
		if err := winner.Release(ctxT(t), "same-id"); err != nil {
			t.Fatal(err)
		}
		if _, ok := be.entry(t, prefix, "same-id"); ok {
			t.Fatal("the entry survived its owner's Release")
		}
		if err := nodes[(won+1)%3].Reserve(ctxT(t), "same-id", 0); err != nil {
			t.Fatalf("Reserve of a released id: %v", err)
		}
	})
}

func TestPublishFollowsLocalRecords(t *testing.T) {
	eachBackend(t, func(t *testing.T, be testBackend) {
		prefix := testPrefix()
		srcA, srcB := newMemSource(), newMemSource()
		a := be.start(t, prefix, "node-a", srcA)
		b := be.start(t, prefix, "node-b", srcB)

		var mu sync.Mutex
		var seen []string
		b.Watch(func(ch Change) {
			if ch.Entry.ID != "x" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if ch.Deleted {
				seen = append(seen, "deleted")
			} else {
				seen = append(seen, string(ch.Entry.State))
			}
		})

		srcA.set(record("x", lifecycle.Running))
		a.Changed("x")
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			e, ok := b.Lookup("x")
			return ok && e.Node == "node-a" && e.State == lifecycle.Running && slices.Equal(e.Ports, []int{8080}) &&
					e.Access == "private" && e.Incarnation == "inc-x" && e.Revision > 0,
				fmt.Sprintf("node-b sees %+v (%v)", e, ok)
		})
		srcA.set(record("x", lifecycle.Paused))
		a.Changed("x")
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			e, _ := b.Lookup("x")
			return e.State == lifecycle.Paused, fmt.Sprintf("node-b sees state %q", e.State)
		})
		srcA.del("x")
		a.Changed("x")
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			_, ok := b.Lookup("x")
			return !ok, "x still in node-b's catalog"
		})
		mu.Lock()
		got := slices.Clone(seen)
		mu.Unlock()
		if want := []string{"running", "paused", "deleted"}; !slices.Equal(got, want) {
			t.Fatalf("node-b's watcher saw %v, want %v", got, want)
		}

		// An id node-b holds is never overwritten or deleted by node-a, by a
		// single publish or a full republish.
		if err := b.Reserve(ctxT(t), "y", 0); err != nil {
			t.Fatal(err)
		}
		srcA.set(record("y", lifecycle.Running))
		a.Changed("y")
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			st := a.Stats()
			return st.Pending == 0, fmt.Sprintf("node-a has %d changes pending", st.Pending)
		})
		if err := a.republish(); err != nil {
			t.Fatal(err)
		}
		if e, ok := be.entry(t, prefix, "y"); !ok || e.Node != "node-b" || e.State != lifecycle.Creating {
			t.Fatalf("y in etcd: %+v (%v), want node-b's reservation", e, ok)
		}
		srcA.del("y")
		a.Changed("y")
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			return a.Stats().Pending == 0, "node-a's delete of y pending"
		})
		if e, ok := be.entry(t, prefix, "y"); !ok || e.Node != "node-b" {
			t.Fatalf("y in etcd after node-a lost its record: %+v (%v), want node-b's", e, ok)
		}

		// A restarted node republishes: its records are put, its entries
		// without records are deleted, other nodes' entries are left alone.
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		be.put(t, prefix+sandboxesDir+"stale", sealed(Entry{ID: "stale", Node: "node-a", State: lifecycle.Running}))
		srcA.set(record("z", lifecycle.Stopped))
		a2 := be.start(t, prefix, "node-a", srcA)
		if e, ok := be.entry(t, prefix, "z"); !ok || e.Node != "node-a" || e.State != lifecycle.Stopped {
			t.Fatalf("z after node-a's restart: %+v (%v)", e, ok)
		}
		if _, ok := be.entry(t, prefix, "stale"); ok {
			t.Fatal("node-a's entry without a record survived its republish")
		}
		if e, ok := be.entry(t, prefix, "y"); !ok || e.Node != "node-b" {
			t.Fatalf("y after node-a's restart: %+v (%v), want node-b's", e, ok)
		}
		waitLive(t, a2, "node-a", "node-b")
		if n, ok := a2.Node("node-b"); !ok || n.Sandboxes != 1 || n.Advertise != "node-b.test:8080" {
			t.Fatalf("node-b as node-a sees it: %+v (%v)", n, ok)
		}
	})
}

func TestLostNodeShowsNotLive(t *testing.T) {
	eachBackend(t, func(t *testing.T, be testBackend) {
		prefix := testPrefix()
		srcC := newMemSource()
		a := be.start(t, prefix, "node-a", newMemSource())
		b := be.start(t, prefix, "node-b", newMemSource())
		c := be.start(t, prefix, "node-c", srcC)
		srcC.set(record("on-c", lifecycle.Running))
		c.Changed("on-c")
		waitLive(t, a, "node-a", "node-b", "node-c")
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			_, ok := a.Lookup("on-c")
			return ok, "on-c not in node-a's catalog"
		})

		crash(c)
		// The lease runs out TTL after the last keepalive; allow 2 s more
		// for etcd's expiry check and the watch.
		for _, n := range []*Cluster{a, b} {
			testenv.Eventually(t, testTTL+2*time.Second, func() (bool, string) {
				info, known := n.Node("node-c")
				return known && !info.Live, fmt.Sprintf("%s sees node-c %+v", n.Self(), info)
			})
		}
		info, _ := a.Node("node-c")
		if info.Sandboxes != 1 || info.Advertise != "node-c.test:8080" {
			t.Fatalf("lost node-c: %+v, want its last advertise address and 1 sandbox", info)
		}
		if e, ok := a.Lookup("on-c"); !ok || e.Node != "node-c" {
			t.Fatalf("on-c after node-c was lost: %+v (%v), want it kept for node-c", e, ok)
		}
		if st := a.Stats(); st.LiveNodes != 2 {
			t.Fatalf("live nodes: %d, want 2", st.LiveNodes)
		}

		// A clean Close revokes the lease: node-b leaves at once.
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		waitLive(t, a, "node-a")
	})
}

func TestEtcdLoss(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	srcA, srcB := newMemSource(), newMemSource()
	a := startNode(t, ec.Endpoints(), prefix, "node-a", srcA)
	b := startNode(t, ec.Endpoints(), prefix, "node-b", srcB)
	waitLive(t, b, "node-a", "node-b")

	// The leader killed: the other two keep a quorum. A write proposed
	// before they elect a new leader is lost; the client's second try
	// reaches the new one.
	leader := ec.Leader()
	ec.Kill(leader)
	for i := range 5 {
		if err := a.Reserve(ctxT(t), fmt.Sprintf("r%d", i), 0); err != nil {
			t.Fatalf("Reserve with one member killed: %v", err)
		}
	}
	srcA.set(record("p1", lifecycle.Running))
	a.Changed("p1")
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		_, ok := b.Lookup("p1")
		return ok, "p1 not published with one member killed"
	})

	// All members down: Reserve fails fast with ErrEtcd, the cache still
	// answers, changes wait.
	for i := range 3 {
		if i != leader {
			ec.Stop(i)
		}
	}
	began := time.Now()
	err := a.Reserve(context.Background(), "while-down", 0)
	took := time.Since(began)
	if !errors.Is(err, ErrEtcd) {
		t.Fatalf("Reserve with etcd down: %v, want ErrEtcd", err)
	}
	if took > 4*time.Second {
		t.Fatalf("Reserve with etcd down took %s, want it to fail within the request timeout", took)
	}
	t.Logf("Reserve with etcd down failed after %s: %v", took.Round(time.Millisecond), err)
	if h := a.Health(); !errors.Is(h, ErrEtcd) {
		t.Fatalf("Health with etcd down: %v", h)
	}
	if e, ok := b.Lookup("p1"); !ok || e.Node != "node-a" {
		t.Fatalf("Lookup with etcd down: %+v (%v), want the cached entry", e, ok)
	}
	srcA.set(record("p2", lifecycle.Running))
	a.Changed("p2")
	srcA.del("p1")
	a.Changed("p1")
	if st := a.Stats(); st.Pending == 0 {
		t.Fatalf("stats with etcd down: %+v, want pending changes", st)
	}
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		return b.Health() != nil, "node-b still healthy with etcd down"
	})

	for i := range 3 {
		ec.Restart(i)
	}
	ec.WaitHealthy()
	for _, n := range []*Cluster{a, b} {
		testenv.Eventually(t, 15*time.Second, func() (bool, string) {
			h := n.Health()
			return h == nil, fmt.Sprintf("%s health: %v", n.Self(), h)
		})
	}
	testenv.Eventually(t, 15*time.Second, func() (bool, string) {
		_, has2 := b.Lookup("p2")
		_, has1 := b.Lookup("p1")
		st := a.Stats()
		return has2 && !has1 && st.Pending == 0, fmt.Sprintf("after etcd came back node-b sees p2=%v p1=%v; node-a pending %d", has2, has1, st.Pending)
	})
	waitLive(t, b, "node-a", "node-b")
	if st := a.Stats(); st.EtcdErrors == 0 {
		t.Fatalf("stats: %+v, want etcd errors counted", st)
	}
}

func TestDrainRemoveAndPlace(t *testing.T) {
	eachBackend(t, func(t *testing.T, be testBackend) {
		prefix := testPrefix()
		srcA, srcB, srcC := newMemSource(), newMemSource(), newMemSource()
		srcA.setCapacity(Capacity{Resident: 5, MaxResident: 10, FreeMemoryMB: 4000})
		srcB.setCapacity(Capacity{Resident: 2, MaxResident: 10, FreeMemoryMB: 1000})
		srcC.setCapacity(Capacity{Resident: 0, MaxResident: 10, FreeMemoryMB: 8000})
		a := be.start(t, prefix, "node-a", srcA)
		be.start(t, prefix, "node-b", srcB)
		c := be.start(t, prefix, "node-c", srcC)
		srcC.set(record("c1", lifecycle.Running))
		srcC.set(record("c2", lifecycle.Stopped))
		c.Changed("c1")
		c.Changed("c2")
		waitLive(t, a, "node-a", "node-b", "node-c")
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			n, _ := a.Node("node-c")
			return n.Sandboxes == 2 && n.Capacity.FreeMemoryMB == 8000, fmt.Sprintf("node-c as seen: %+v", n)
		})

		placed := func() string {
			t.Helper()
			n, err := a.Place(512)
			if err != nil {
				t.Fatal(err)
			}
			return n.Name
		}
		if got := placed(); got != "node-c" {
			t.Fatalf("Place: %s, want node-c (least loaded)", got)
		}
		if err := a.Drain(ctxT(t), "node-c", true); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			n, _ := a.Node("node-c")
			return n.Draining, "node-c not draining"
		})
		if got := placed(); got != "node-b" {
			t.Fatalf("Place with node-c draining: %s, want node-b", got)
		}
		// Capacity is refreshed with the lease: node-b filling up moves
		// placement to node-a.
		srcB.setCapacity(Capacity{Resident: 10, MaxResident: 10, FreeMemoryMB: 1000})
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			n, _ := a.Node("node-b")
			return n.Capacity.Resident == 10, fmt.Sprintf("node-b's capacity as seen: %+v", n.Capacity)
		})
		if got := placed(); got != "node-a" {
			t.Fatalf("Place with node-b full: %s, want node-a", got)
		}
		if err := a.Drain(ctxT(t), "node-a", true); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			_, err := a.Place(512)
			return errors.Is(err, ErrNoRoom), fmt.Sprintf("Place with every node passed over: %v", err)
		})
		_, err := a.Place(512)
		for _, want := range []string{"node-a: draining", "node-b: 10 of max_resident 10", "node-c: draining"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("ErrNoRoom message %q does not say %q", err, want)
			}
		}
		if err := a.Drain(ctxT(t), "node-a", false); err != nil {
			t.Fatal(err)
		}
		if err := a.Drain(ctxT(t), "nobody", true); !errors.Is(err, ErrUnknownNode) {
			t.Fatalf("Drain of an unknown node: %v", err)
		}

		// Remove refuses a live node, then marks a lost node's entries killed.
		if _, err := a.Remove(ctxT(t), "node-c"); err == nil || !strings.Contains(err.Error(), "live") {
			t.Fatalf("Remove of a live node: %v, want a refusal naming its liveness", err)
		}
		// Forget leaves a live node's sandbox alone.
		if gone, err := a.Forget(ctxT(t), "c1"); err != nil || gone {
			t.Fatalf("Forget of a live node's sandbox: %v, %v; want false, nil", gone, err)
		}
		crash(c)
		testenv.Eventually(t, testTTL+2*time.Second, func() (bool, string) {
			n, _ := a.Node("node-c")
			return !n.Live, "node-c still live"
		})
		// Lost but not removed: still not forgettable (the node may come back).
		if gone, err := a.Forget(ctxT(t), "c1"); err != nil || gone {
			t.Fatalf("Forget of a lost, not removed node's sandbox: %v, %v; want false, nil", gone, err)
		}
		killed, err := a.Remove(ctxT(t), "node-c")
		if err != nil || killed != 2 {
			t.Fatalf("Remove of a lost node: %d killed, %v; want 2", killed, err)
		}
		for _, id := range []string{"c1", "c2"} {
			if e, ok := be.entry(t, prefix, id); !ok || e.State != lifecycle.Killed || e.Reason != ReasonNodeRemoved || e.Node != "node-c" {
				t.Fatalf("%s after Remove: %+v (%v)", id, e, ok)
			}
		}
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			n, _ := a.Node("node-c")
			return !n.Draining, "node-c's drain mark survived Remove"
		})
		if killed, err := a.Remove(ctxT(t), "node-c"); err != nil || killed != 0 {
			t.Fatalf("second Remove: %d, %v; want 0 and no error", killed, err)
		}
		// A removed node's sandbox is forgotten: its entry goes and the id
		// can be taken again.
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			e, _ := a.Lookup("c1")
			return e.State == lifecycle.Killed, fmt.Sprintf("c1 as a sees it: %+v", e)
		})
		if gone, err := a.Forget(ctxT(t), "c1"); err != nil || !gone {
			t.Fatalf("Forget of a removed node's sandbox: %v, %v; want true, nil", gone, err)
		}
		if e, ok := be.entry(t, prefix, "c1"); ok {
			t.Fatalf("c1 still in etcd after Forget: %+v", e)
		}
		if err := a.Reserve(ctxT(t), "c1", 64); err != nil {
			t.Fatalf("Reserve of a forgotten id: %v", err)
		}
		if e, ok := be.entry(t, prefix, "c2"); !ok || e.State != lifecycle.Killed {
			t.Fatalf("c2 after forgetting c1: %+v (%v)", e, ok)
		}
		if _, err := a.Remove(ctxT(t), "nobody"); !errors.Is(err, ErrUnknownNode) {
			t.Fatalf("Remove of an unknown node: %v", err)
		}
	})
}

// TestCatalogReloadsAfterCompaction: a watch that cannot resume (its
// revision compacted) ends, and the reload tells watchers what changed
// meanwhile: entries gone and entries new.
func TestCatalogReloadsAfterCompaction(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	prefix := testPrefix()
	srcA := newMemSource()
	a := startNode(t, ec.Endpoints(), prefix, "node-a", srcA)
	srcA.set(record("kept", lifecycle.Running))
	a.Changed("kept")
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		_, ok := a.Lookup("kept")
		return ok, "kept not in the catalog"
	})
	cli := newClient(t, ec.Endpoints())
	resp, err := cli.Get(ctxT(t), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctxT(t), resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if err := a.followCatalog(1); err == nil || !strings.Contains(err.Error(), "compacted") {
		t.Fatalf("watch from a compacted revision: %v, want it to end as compacted", err)
	}

	// Make the cache miss a change and hold a ghost, as after a gap.
	var changes []Change
	var mu sync.Mutex
	a.Watch(func(ch Change) {
		mu.Lock()
		changes = append(changes, ch)
		mu.Unlock()
	})
	// Both the entries and Lookup's mirror of them, as the watch keeps them.
	a.cache.mu.Lock()
	delete(a.cache.entries, "kept")
	a.cache.index.Delete("kept")
	a.cache.uncount("node-a")
	ghost := Entry{ID: "ghost", Node: "node-a", Revision: 1}
	a.cache.entries["ghost"] = &ghost
	a.cache.index.Store("ghost", &ghost)
	a.cache.counts["node-a"]++
	a.cache.mu.Unlock()
	if _, err := a.loadCatalog(); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Lookup("ghost"); ok {
		t.Fatal("the reload kept an entry etcd does not have")
	}
	if e, ok := a.Lookup("kept"); !ok || e.State != lifecycle.Running {
		t.Fatalf("kept after the reload: %+v (%v)", e, ok)
	}
	mu.Lock()
	defer mu.Unlock()
	got := map[string]bool{}
	for _, ch := range changes {
		got[ch.Entry.ID] = ch.Deleted
	}
	if del, ok := got["ghost"]; !ok || !del {
		t.Fatalf("watchers saw %+v, want ghost deleted", changes)
	}
	if del, ok := got["kept"]; !ok || del {
		t.Fatalf("watchers saw %+v, want kept put", changes)
	}
	if n, _ := a.Node("node-a"); n.Sandboxes != 1 {
		t.Fatalf("node-a's sandbox count after the reload: %d, want 1", n.Sandboxes)
	}
	checkMirror(t, a)
}

// checkMirror fails unless Lookup's index holds exactly the cache's entries.
func checkMirror(t *testing.T, c *Cluster) {
	t.Helper()
	c.cache.mu.RLock()
	defer c.cache.mu.RUnlock()
	n := 0
	c.cache.index.Range(func(k, v any) bool {
		n++
		e, ok := c.cache.entries[k.(string)]
		if !ok || e.Revision != v.(*Entry).Revision {
			t.Errorf("Lookup's index has %s at revision %d, the entries %+v (%v)", k, v.(*Entry).Revision, e, ok)
		}
		return true
	})
	if n != len(c.cache.entries) {
		t.Errorf("Lookup's index has %d ids, the entries %d", n, len(c.cache.entries))
	}
}

// TestCloseWithEtcdDown: Close returns within seconds with etcd gone and
// in-flight work pending, and leaves no goroutine behind.
func TestCloseWithEtcdDown(t *testing.T) {
	ec := etcdtest.Start(t, 3)
	base := runtime.NumGoroutine()
	prefix := testPrefix()
	src := newMemSource()
	a := startNode(t, ec.Endpoints(), prefix, "node-a", src)
	src.set(record("x", lifecycle.Running))
	a.Changed("x")
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		_, ok := a.Lookup("x")
		return ok, "x not published"
	})
	for i := range 3 {
		ec.Kill(i)
	}
	// Work in flight when Close comes: a publish retrying, a reservation.
	src.set(record("y", lifecycle.Running))
	a.Changed("y")
	reserved := make(chan error, 1)
	go func() { reserved <- a.Reserve(context.Background(), "z", 0) }()
	var closed atomic.Bool
	go func() {
		_ = a.Close()
		closed.Store(true)
	}()
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		return closed.Load(), "Close with etcd down has not returned"
	})
	if err := <-reserved; err == nil {
		t.Fatal("Reserve succeeded with etcd down")
	}
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		n := runtime.NumGoroutine()
		if n <= base {
			return true, ""
		}
		buf := make([]byte, 1<<20)
		return false, fmt.Sprintf("%d goroutines after Close, %d before Start:\n%s", n, base, buf[:runtime.Stack(buf, true)])
	})
}

// etcdCli is the etcd client of c's store (tests of the etcd backend).
func (c *Cluster) etcdCli() *clientv3.Client { return c.st.(*etcdStore).cli }
