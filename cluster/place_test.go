package cluster

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// withNodes is a cluster whose cache holds the given registrations.
func withNodes(t *testing.T, live []NodeInfo, draining ...string) *Cluster {
	t.Helper()
	c := offlineNode(t, "self")
	for _, n := range live {
		c.cache.live[n.Name] = n
	}
	for _, n := range draining {
		c.cache.drain[n] = true
	}
	return c
}

func capNode(name string, resident, maxResident int, free, minFree int64) NodeInfo {
	return NodeInfo{Name: name, Capacity: Capacity{Resident: resident, MaxResident: maxResident, FreeMemoryMB: free, MinFreeMemoryMB: minFree}}
}

func TestPlace(t *testing.T) {
	tests := []struct {
		name     string
		live     []NodeInfo
		draining []string
		memoryMB int64
		want     string
		wantErr  []string
	}{
		{name: "least resident share first", memoryMB: 256, want: "b",
			live: []NodeInfo{capNode("a", 5, 10, 4000, 0), capNode("b", 2, 10, 1000, 0), capNode("c", 3, 5, 9000, 0)}},
		{name: "equal share: more free memory", memoryMB: 256, want: "c",
			live: []NodeInfo{capNode("a", 2, 10, 4000, 0), capNode("c", 2, 10, 5000, 0)}},
		{name: "full node skipped", memoryMB: 0, want: "b",
			live: []NodeInfo{capNode("a", 10, 10, 9000, 0), capNode("b", 9, 10, 100, 0)}},
		{name: "memory minimum respected", memoryMB: 512, want: "b",
			live: []NodeInfo{capNode("a", 0, 10, 1000, 600), capNode("b", 5, 10, 2000, 600)}},
		{name: "node that measures no memory is not checked", memoryMB: 512, want: "a",
			live: []NodeInfo{capNode("a", 0, 0, 0, 0)}},
		{name: "draining excluded", memoryMB: 0, want: "b", draining: []string{"a"},
			live: []NodeInfo{capNode("a", 0, 10, 1000, 0), capNode("b", 5, 10, 1000, 0)}},
		{name: "no room says why for each node", memoryMB: 512, draining: []string{"a", "gone"},
			live:    []NodeInfo{capNode("a", 0, 10, 1000, 0), capNode("b", 3, 3, 1000, 0), capNode("c", 0, 10, 800, 400)},
			wantErr: []string{"a: draining", "b: 3 of max_resident 3", "c: 800 MB free, needs 512 MB", "gone: not live"}},
		{name: "no nodes", memoryMB: 1, wantErr: []string{"no node is registered"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := withNodes(t, tt.live, tt.draining...)
			got, err := c.Place(tt.memoryMB)
			if tt.wantErr != nil {
				if !errors.Is(err, ErrNoRoom) {
					t.Fatalf("Place = %+v, %v; want ErrNoRoom", got, err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil || got.Name != tt.want {
				t.Fatalf("Place = %q, %v; want %q", got.Name, err, tt.want)
			}
		})
	}
}

// TestPlaceSpreadsABurst: creates placed between two registrations of the
// nodes' figures count where they went, so a burst spreads over equal
// nodes instead of piling on the first; a fresh registration replaces the
// count with the node's own figures.
func TestPlaceSpreadsABurst(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := capNode("a", 0, 4, 8000, 1000), capNode("b", 0, 4, 8000, 1000)
	a.Live, b.Live, a.UpdatedAt, b.UpdatedAt = true, true, at, at
	c := withNodes(t, []NodeInfo{a, b})
	var got []string
	per := map[string]int{}
	for i := range 8 {
		n, err := c.Place(512)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, n.Name)
		per[n.Name]++
		if i%2 == 1 && per["a"] != per["b"] {
			t.Fatalf("placements %v: a burst over two equal nodes must alternate between them", got)
		}
	}
	// Both full now (4 of max_resident 4 counted): the error says so.
	if _, err := c.Place(512); !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "4 of max_resident 4") {
		t.Fatalf("ninth placement: %v, want ErrNoRoom counting the placed ones", err)
	}
	// a registers again, having taken 1 of its 4: its own figures count.
	a.Capacity.Resident, a.UpdatedAt = 1, at.Add(time.Second)
	c.cache.live["a"] = a
	if n, err := c.Place(512); err != nil || n.Name != "a" {
		t.Fatalf("after a's fresh figures: %v, %v; want a", n.Name, err)
	}
	// Memory placed counts too: b, refreshed with room for one more
	// sandbox of 3000 MB above its minimum, gets one, then none.
	b.Capacity.Resident, b.Capacity.FreeMemoryMB, b.UpdatedAt = 0, 4500, at.Add(2*time.Second)
	c.cache.live["b"] = b
	c.cache.drain["a"] = true
	if n, err := c.Place(3000); err != nil || n.Name != "b" {
		t.Fatalf("first 3000 MB: %v, %v; want b", n.Name, err)
	}
	if _, err := c.Place(3000); !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "1500 MB free") {
		t.Fatalf("second 3000 MB: %v, want ErrNoRoom with b's memory counted", err)
	}
}

// TestPlacePassesOverUnreachable: a node that did not answer a create is
// passed over, and ErrNoRoom says so when it was the only choice.
func TestPlacePassesOverUnreachable(t *testing.T) {
	a, b := capNode("a", 0, 10, 0, 0), capNode("b", 5, 10, 0, 0)
	a.Live, b.Live = true, true
	c := withNodes(t, []NodeInfo{a, b})
	if n, err := c.Place(64, "a"); err != nil || n.Name != "b" {
		t.Fatalf("Place without a: %v, %v; want b", n.Name, err)
	}
	if _, err := c.Place(64, "a", "b"); !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "a: did not answer the create") {
		t.Fatalf("Place without a and b: %v, want ErrNoRoom naming a's silence", err)
	}
}

// TestPlaceBreaksTiesAtRandom: equal nodes are chosen at random, so that
// gateways with the same view do not all send a burst to the same one.
func TestPlaceBreaksTiesAtRandom(t *testing.T) {
	per := map[string]int{}
	for range 300 {
		c := withNodes(t, []NodeInfo{capNode("a", 1, 10, 4000, 0), capNode("b", 1, 10, 4000, 0), capNode("c", 1, 10, 4010, 0)})
		n, err := c.Place(256)
		if err != nil {
			t.Fatal(err)
		}
		per[n.Name]++
	}
	for _, name := range []string{"a", "b", "c"} {
		if per[name] < 60 {
			t.Errorf("of 300 placements over three equal nodes, %s got %d: %v", name, per[name], per)
		}
	}
}

// TestPlaceByTwoChoicesPastManyNodes: past powerOfTwoFrom nodes, a burst
// still spreads (the better of two at random) and never picks a full node.
func TestPlaceByTwoChoicesPastManyNodes(t *testing.T) {
	var nodes []NodeInfo
	for i := range 60 {
		n := capNode(fmt.Sprintf("n%02d", i), 0, 20, 8000, 0)
		if i%10 == 0 {
			n.Capacity.Resident = 20 // full
		}
		nodes = append(nodes, n)
	}
	c := withNodes(t, nodes)
	per := map[string]int{}
	for range 540 {
		n, err := c.Place(64)
		if err != nil {
			t.Fatal(err)
		}
		if n.Capacity.Resident > 20 || strings.HasSuffix(n.Name, "0") {
			t.Fatalf("a full node was chosen: %+v", n)
		}
		per[n.Name]++
	}
	for name, k := range per {
		if k < 4 || k > 16 {
			t.Errorf("node %s got %d of 540 over 54 nodes with room (want 10 ± 6): %v", name, k, per)
		}
	}
	if len(per) != 54 {
		t.Errorf("%d nodes used, want all 54 with room", len(per))
	}
}

// TestPoolNodesShareABurstPastManyNodes: past powerOfTwoFrom nodes, a
// burst of creates from a template goes to the nodes with its idle pool
// containers, spread over them by load, not all to the first by name.
func TestPoolNodesShareABurstPastManyNodes(t *testing.T) {
	var nodes []NodeInfo
	for i := range 60 {
		n := capNode(fmt.Sprintf("n%02d", i), 0, 100, 8000, 0)
		if i%15 == 1 {
			n.Capacity.Pools = map[string]int{"t": 100}
		}
		nodes = append(nodes, n)
	}
	c := withNodes(t, nodes)
	per := map[string]int{}
	for range 40 {
		n, err := c.PlaceFrom("t", 64)
		if err != nil {
			t.Fatal(err)
		}
		per[n.Name]++
	}
	for _, name := range []string{"n01", "n16", "n31", "n46"} {
		if k := per[name]; k < 5 {
			t.Errorf("pool node %s got %d of 40 creates from the template (want about 10): %v", name, k, per)
		}
	}
	if len(per) != 4 {
		t.Errorf("creates from the template went to nodes without its pool: %v", per)
	}
}

// TestPlaceCountsTheCatalog: between two registrations of equal nodes, the
// catalog's entries (another gateway's creates) say which has fewer.
func TestPlaceCountsTheCatalog(t *testing.T) {
	for range 20 {
		c := withNodes(t, []NodeInfo{capNode("a", 0, 10, 4000, 0), capNode("b", 0, 10, 4000, 0), capNode("c", 0, 10, 4000, 0)})
		c.cache.counts["a"], c.cache.counts["b"] = 2, 1
		if n, err := c.Place(256); err != nil || n.Name != "c" {
			t.Fatalf("Place = %q, %v; want c (no catalog entries)", n.Name, err)
		}
		if n, err := c.Place(256); err != nil || n.Name != "b" && n.Name != "c" {
			t.Fatalf("second Place = %q, %v; want b or c (a has the most)", n.Name, err)
		}
	}
}
