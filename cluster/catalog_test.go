package cluster

import (
	"fmt"
	"testing"
)

func filledCatalog(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c := offlineNode(tb, "self")
	for i := range n {
		id := fmt.Sprintf("sb-%d", i)
		e := Entry{ID: id, Node: "node-a", Ports: []int{8080}}
		c.cache.entries[id] = &e
		c.cache.index.Store(id, &e)
	}
	return c
}

// TestLookupDoesNotAllocate holds the request path's promise.
func TestLookupDoesNotAllocate(t *testing.T) {
	c := filledCatalog(t, 1000)
	id := "sb-500"
	if allocs := testing.AllocsPerRun(1000, func() {
		if _, ok := c.Lookup(id); !ok {
			t.Fatal("sb-500 missing")
		}
	}); allocs != 0 {
		t.Fatalf("Lookup allocates %.1f times per call, want 0", allocs)
	}
}

func BenchmarkLookup(b *testing.B) {
	c := filledCatalog(b, 10_000)
	ids := []string{"sb-1", "sb-5000", "sb-9999", "missing"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			c.Lookup(ids[i&3])
			i++
		}
	})
}
