package cluster

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/sandwake/sandwake/internal/etcdtest"
	"github.com/sandwake/sandwake/lifecycle"
)

// seedCatalog writes n sandbox entries under prefix, as nodes publish
// them (three owners, a label each), in transactions of etcd's default
// maximum of 128 operations, 8 at a time.
func seedCatalog(tb testing.TB, cli *clientv3.Client, prefix string, n int) {
	tb.Helper()
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	states := []lifecycle.State{lifecycle.Running, lifecycle.Paused, lifecycle.Stopped, lifecycle.Stopped}
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(8)
	for lo := 0; lo < n; lo += 128 {
		g.Go(func() error {
			var ops []clientv3.Op
			for i := lo; i < min(lo+128, n); i++ {
				id := fmt.Sprintf("sb%07d", i)
				v := sealed(Entry{
					ID: id, Node: "node-" + strconv.Itoa(i%3), State: states[i%len(states)], Reason: "idle",
					Ports: []int{8080}, Access: "public", Incarnation: fmt.Sprintf("01JDX%021d", i), TokenGeneration: 1,
					MemoryMB: 512, Labels: map[string]string{"team": "t" + strconv.Itoa(i%50)},
					CreatedAt: at, UpdatedAt: at,
				})
				ops = append(ops, clientv3.OpPut(prefix+sandboxesDir+id, string(v)))
			}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := cli.Txn(cctx).Then(ops...).Commit()
			return err
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatalf("seeding %d catalog entries: %v", n, err)
	}
}

// TestCatalogLoadsInPages: a catalog larger than a page is loaded whole, at
// one revision, and a reload after a compaction converges on etcd's content
// (deleted entries gone, changed ones new, unchanged ones the same
// pointers Lookup already had).
func TestCatalogLoadsInPages(t *testing.T) {
	// Restored after the node's cleanup has closed it (cleanups run last
	// registered first): its loops read catalogPage until then.
	old := catalogPage
	t.Cleanup(func() { catalogPage = old })
	catalogPage = 100
	ec := etcdtest.Start(t, 1)
	prefix := testPrefix()
	cli := newClient(t, ec.Endpoints())
	const n = 1050
	seedCatalog(t, cli, prefix, n)
	a := startNode(t, ec.Endpoints(), prefix, "node-a", newMemSource())
	if got := len(a.Entries()); got != n {
		t.Fatalf("the catalog holds %d entries after the first load, want %d", got, n)
	}
	checkMirror(t, a)
	kept, _ := a.cache.index.Load("sb0000500")

	// Behind the node's back: a page's worth deleted, one entry changed,
	// then everything compacted.
	for i := 200; i < 320; i++ {
		if _, err := cli.Delete(ctxT(t), fmt.Sprintf("%s%ssb%07d", prefix, sandboxesDir, i)); err != nil {
			t.Fatal(err)
		}
	}
	changed := sealed(Entry{ID: "sb0000007", Node: "node-b", State: lifecycle.Running, Ports: []int{8080}})
	resp, err := cli.Put(ctxT(t), prefix+sandboxesDir+"sb0000007", string(changed))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctxT(t), resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if _, err := a.loadCatalog(); err != nil {
		t.Fatal(err)
	}
	if got := len(a.Entries()); got != n-120 {
		t.Fatalf("the catalog holds %d entries after the reload, want %d", got, n-120)
	}
	if _, ok := a.Lookup("sb0000250"); ok {
		t.Fatal("a deleted entry survived the reload")
	}
	if e, ok := a.Lookup("sb0000007"); !ok || e.Node != "node-b" {
		t.Fatalf("the changed entry after the reload: %+v (%v)", e, ok)
	}
	if now, _ := a.cache.index.Load("sb0000500"); now != kept {
		t.Fatal("an unchanged entry was stored again by the reload")
	}
	checkMirror(t, a)
	// Interned: every entry of a node names it with the same string.
	e1, _ := a.cache.index.Load("sb0000001")
	e4, _ := a.cache.index.Load("sb0000004")
	if n1, n4 := e1.(*Entry).Node, e4.(*Entry).Node; n1 != n4 || unsafeData(n1) != unsafeData(n4) {
		t.Fatalf("node names %q and %q are separate copies", n1, n4)
	}
}

// BenchmarkCatalogAtScale measures a node's catalog over a real etcd holding
// SANDWAKE_BENCH_CATALOG entries (default 100,000): the first load at start,
// the Go heap it holds per entry, Lookup, and a reload after the watch lost
// its revision to a compaction (nothing changed: the diff finds no change).
//
//	SANDWAKE_BENCH_CATALOG=1000000 go test -run '^$' -bench CatalogAtScale -benchtime 1x -timeout 30m ./cluster/
func BenchmarkCatalogAtScale(b *testing.B) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("SANDWAKE_BENCH_CATALOG")); err == nil && v > 0 {
		n = v
	}
	defer func(d time.Duration) { startTimeout = d }(startTimeout)
	startTimeout = 10 * time.Minute
	ec := etcdtest.Start(b, 1)
	prefix := testPrefix()
	cli := newClient(b, ec.Endpoints())
	t0 := time.Now()
	seedCatalog(b, cli, prefix, n)
	b.Logf("seeded %d entries in %s", n, time.Since(t0).Round(time.Millisecond))
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != int64(n) {
		b.Fatalf("etcd holds %d entries (%v), want %d", resp.Count, err, n)
	}
	for range b.N {
		heap0 := heapAfterGC()
		t0 = time.Now()
		a := startNode(b, ec.Endpoints(), prefix, "node-a", newMemSource())
		load := time.Since(t0)
		if got := len(a.cache.entries); got != n {
			b.Fatalf("loaded %d entries, want %d", got, n)
		}
		heap1 := heapAfterGC()
		ids := make([]string, 1024)
		for i := range ids {
			ids[i] = fmt.Sprintf("sb%07d", (i*7919)%n)
		}
		const lookups = 1_000_000
		t0 = time.Now()
		for i := range lookups {
			if _, ok := a.Lookup(ids[i&1023]); !ok {
				b.Fatal("an entry is missing")
			}
		}
		lookup := time.Since(t0)
		t0 = time.Now()
		if _, err := a.loadCatalog(); err != nil {
			b.Fatal(err)
		}
		reload := time.Since(t0)
		b.ReportMetric(float64(load.Milliseconds()), "load-ms")
		b.ReportMetric(float64(reload.Milliseconds()), "reload-ms")
		b.ReportMetric(float64(heap1-heap0)/float64(n), "heap-B/entry")
		b.ReportMetric(float64(lookup.Nanoseconds())/lookups, "lookup-ns")
		_ = a.Close()
	}
}

// unsafeData is where s's bytes are: two strings that share it are one copy.
func unsafeData(s string) *byte { return unsafe.StringData(s) }

func heapAfterGC() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
